// Bearer tokens with roles (DESIGN.md section 5b): who may call what on a LazyKV server.
//
// A tokens file has one token per line, `#` starting a comment:
//     TOKEN NAME ROLE[,ROLE...]
// e.g. `3f9a...e1 worker-7 worker`. TOKEN is at least 16 characters of printable ASCII
// (generate one with `openssl rand -hex 32`); NAME identifies the caller in logs and in
// per-client limits; roles are `client` (Generate, Tokenize), `worker` (Lookup, Get, Put,
// Lease, ReleaseLease) and `admin` (Delete, Stats). Only SHA-256 digests of the tokens
// are kept in memory, and a presented token is compared against every entry in constant
// time, so neither timing nor a memory dump gives a token away.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/mutex.h"

namespace lazykv {

enum class Role : uint8_t { kClient = 1, kWorker = 2, kAdmin = 4 };

std::string_view RoleName(Role role);

// A caller the tokens file names.
struct Principal {
  std::string name;
  uint8_t roles = 0;  // a bit set of Role values
  bool Has(Role role) const { return (roles & static_cast<uint8_t>(role)) != 0; }
};

// An immutable set of tokens. Thread-safe (const after Parse).
class TokenTable {
 public:
  // INVALID_ARGUMENT naming the line for a malformed entry, a short token, an unknown
  // role, or a token or name given twice.
  static absl::StatusOr<TokenTable> Parse(std::string_view text);

  // The principal holding `token`, if any. Runs in time independent of where (or
  // whether) the token matches.
  std::optional<Principal> Find(std::string_view token) const;
  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    std::array<uint8_t, 32> digest;
    Principal principal;
  };
  std::vector<Entry> entries_;
};

// A tokens file that is read again when it changes (checked at most every
// `check_interval`), so tokens are added and revoked without a restart. A change that
// does not parse is logged and the previous tokens stay in force. Thread-safe.
class TokenFile {
 public:
  // The file must exist and parse; the error names it.
  static absl::StatusOr<std::unique_ptr<TokenFile>> Open(std::string path, std::chrono::milliseconds check_interval);

  std::optional<Principal> Find(std::string_view token);
  const std::string& path() const { return path_; }

 private:
  TokenFile(std::string path, std::chrono::milliseconds check_interval);
  void ReloadIfChanged() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  const std::chrono::milliseconds check_interval_;
  Mutex mu_;
  std::shared_ptr<const TokenTable> table_ ABSL_GUARDED_BY(mu_);
  std::chrono::steady_clock::time_point last_check_ ABSL_GUARDED_BY(mu_);
  std::string fingerprint_ ABSL_GUARDED_BY(mu_);  // mtime, size and inode last read
};

}  // namespace lazykv
