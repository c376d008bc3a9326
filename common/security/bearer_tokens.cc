#include "common/security/bearer_tokens.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>
#include <spdlog/spdlog.h>

#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/security/secret_file.h"

namespace lazykv {
namespace {

constexpr size_t kMinTokenChars = 16;

std::array<uint8_t, 32> Digest(std::string_view token) {
  std::array<uint8_t, 32> out;
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(), out.data());
  return out;
}

absl::StatusOr<uint8_t> ParseRoles(absl::string_view list) {
  uint8_t roles = 0;
  for (absl::string_view name : absl::StrSplit(list, ',')) {
    if (name == "client") {
      roles |= static_cast<uint8_t>(Role::kClient);
    } else if (name == "worker") {
      roles |= static_cast<uint8_t>(Role::kWorker);
    } else if (name == "admin") {
      roles |= static_cast<uint8_t>(Role::kAdmin);
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown role '", name, "' (client, worker or admin)"));
    }
  }
  return roles;
}

bool PrintableToken(absl::string_view token) {
  for (char c : token) {
    if (c <= ' ' || c > '~') return false;
  }
  return true;
}

}  // namespace

std::string_view RoleName(Role role) {
  switch (role) {
    case Role::kClient:
      return "client";
    case Role::kWorker:
      return "worker";
    case Role::kAdmin:
      return "admin";
  }
  return "?";
}

absl::StatusOr<TokenTable> TokenTable::Parse(std::string_view std_text) {
  const absl::string_view text(std_text.data(), std_text.size());
  TokenTable table;
  std::set<std::string> names;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    if (size_t hash = line.find('#'); hash != absl::string_view::npos) line = line.substr(0, hash);
    std::vector<absl::string_view> fields = absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (fields.empty()) continue;
    auto error = [&](absl::string_view what) {
      return absl::InvalidArgumentError(absl::StrCat("line ", line_number, ": ", what));
    };
    if (fields.size() != 3) return error("expected TOKEN NAME ROLE[,ROLE...]");
    if (fields[0].size() < kMinTokenChars) {
      return error(absl::StrCat("token shorter than ", kMinTokenChars, " characters"));
    }
    if (!PrintableToken(fields[0])) return error("token holds a character outside printable ASCII");
    absl::StatusOr<uint8_t> roles = ParseRoles(fields[2]);
    if (!roles.ok()) return error(roles.status().message());
    if (!names.insert(std::string(fields[1])).second) return error(absl::StrCat("name '", fields[1], "' given twice"));
    Entry entry{Digest(std::string_view(fields[0].data(), fields[0].size())),
                Principal{std::string(fields[1]), *roles}};
    for (const Entry& other : table.entries_) {
      if (other.digest == entry.digest) return error("token given twice");
    }
    table.entries_.push_back(std::move(entry));
  }
  return table;
}

std::optional<Principal> TokenTable::Find(std::string_view token) const {
  // Every entry is compared, without an early exit, so the time taken says nothing of
  // which entry (if any) matched.
  const std::array<uint8_t, 32> digest = Digest(token);
  const Entry* match = nullptr;
  for (const Entry& entry : entries_) {
    const bool equal = CRYPTO_memcmp(entry.digest.data(), digest.data(), digest.size()) == 0;
    match = equal ? &entry : match;
  }
  if (match == nullptr) return std::nullopt;
  return match->principal;
}

TokenFile::TokenFile(std::string path, std::chrono::milliseconds check_interval)
    : path_(std::move(path)), check_interval_(check_interval) {}

absl::StatusOr<std::unique_ptr<TokenFile>> TokenFile::Open(std::string path, std::chrono::milliseconds check_interval) {
  std::unique_ptr<TokenFile> file(new TokenFile(std::move(path), check_interval));
  const std::string fingerprint = FileVersion(file->path_);
  absl::StatusOr<std::string> text = ReadSecretFile(file->path_);
  if (!text.ok()) return text.status();
  absl::StatusOr<TokenTable> table = TokenTable::Parse(*text);
  if (!table.ok()) return absl::InvalidArgumentError(absl::StrCat(file->path_, ": ", table.status().message()));
  if (table->size() == 0) return absl::InvalidArgumentError(absl::StrCat(file->path_, ": no tokens"));
  MutexLock lock(&file->mu_);
  file->table_ = std::make_shared<const TokenTable>(*std::move(table));
  file->fingerprint_ = fingerprint;
  file->last_check_ = std::chrono::steady_clock::now();
  return file;
}

void TokenFile::ReloadIfChanged() {
  const auto now = std::chrono::steady_clock::now();
  if (now - last_check_ < check_interval_) return;
  last_check_ = now;
  const std::string fingerprint = FileVersion(path_);
  if (fingerprint == fingerprint_) return;
  fingerprint_ = fingerprint;  // a bad version is reported once, not on every check
  absl::StatusOr<std::string> text = ReadSecretFile(path_);
  absl::StatusOr<TokenTable> table = text.ok() ? TokenTable::Parse(*text) : text.status();
  if (!table.ok()) {
    spdlog::error("tokens file {} changed but cannot be used ({}); keeping the previous tokens", path_,
                  std::string(table.status().message()));
    return;
  }
  spdlog::info("tokens file {} reloaded: {} tokens", path_, table->size());
  table_ = std::make_shared<const TokenTable>(*std::move(table));
}

std::optional<Principal> TokenFile::Find(std::string_view token) {
  std::shared_ptr<const TokenTable> table;
  {
    MutexLock lock(&mu_);
    ReloadIfChanged();
    table = table_;
  }
  return table->Find(token);
}

}  // namespace lazykv
