#include "worker/tokenizer/pretokenizer_regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "spdlog/spdlog.h"

namespace lazykv {
namespace {

// Unicode's White_Space property (what Rust's and Oniguruma's Unicode \s match), as the
// inside of a character class.
constexpr char kWhiteSpace[] =
    "\\t\\n\\x0B\\f\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";

absl::StatusOr<std::string> RewriteWhiteSpace(std::string_view p) {
  std::string out;
  out.reserve(p.size() * 2);
  bool in_class = false;
  for (size_t i = 0; i < p.size();) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char n = p[i + 1];
      if (n == 'Q') return absl::InvalidArgumentError("\\Q...\\E quoting is not supported");
      if (n == 's') {
        out += in_class ? std::string(kWhiteSpace) : absl::StrCat("[", kWhiteSpace, "]");
      } else if (n == 'S') {
        if (in_class) return absl::InvalidArgumentError("\\S inside a character class is not supported");
        out += absl::StrCat("[^", kWhiteSpace, "]");
      } else {
        out.append(p.substr(i, 2));
      }
      i += 2;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      ++i;
      if (i < p.size() && p[i] == '^') out += p[i++];
      if (i < p.size() && p[i] == ']') out += p[i++];  // a leading ']' is literal
      continue;
    }
    if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // [:alpha:]
      const size_t end = p.find(":]", i + 2);
      if (end == std::string_view::npos) return absl::InvalidArgumentError("unterminated POSIX class");
      out += p.substr(i, end + 2 - i);
      i = end + 2;
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out += c;
    ++i;
  }
  return out;
}

size_t Utf8Length(uint8_t lead) { return lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4; }

struct MatchDataDeleter {
  void operator()(pcre2_match_data* md) const { pcre2_match_data_free(md); }
};

}  // namespace

void PretokenizerRegex::CodeDeleter::operator()(pcre2_real_code_8* code) const { pcre2_code_free(code); }

absl::StatusOr<PretokenizerRegex> PretokenizerRegex::Compile(std::string_view pattern) {
  auto rewritten = RewriteWhiteSpace(pattern);
  if (!rewritten.ok()) return rewritten.status();
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(rewritten->data()), rewritten->size(),
                                   PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return absl::InvalidArgumentError(absl::StrFormat("regex does not compile (PCRE2 at offset %d of \"%s\"): %s",
                                                      offset, *rewritten, reinterpret_cast<const char*>(message)));
  }
  const bool jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  return PretokenizerRegex(*std::move(rewritten), code, jit);
}

void PretokenizerRegex::Split(std::string_view text, absl::FunctionRef<void(std::string_view)> piece) const {
  while (!text.empty()) {
    const size_t valid = ValidUtf8PrefixLength(text);
    if (valid > 0) SplitValid(text.substr(0, valid), piece);
    if (valid == text.size()) break;
    piece(text.substr(valid, 1));  // a byte that starts no valid character
    text.remove_prefix(valid + 1);
  }
}

void PretokenizerRegex::SplitValid(std::string_view text, absl::FunctionRef<void(std::string_view)> piece) const {
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> md(pcre2_match_data_create(1, nullptr));
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0, gap = 0;  // where the next search starts; where the unmatched text starts
  while (pos < text.size()) {
    int rc = pcre2_match(code_.get(), subject, text.size(), pos, PCRE2_NO_UTF_CHECK, md.get(), nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      rc = pcre2_match(code_.get(), subject, text.size(), pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md.get(), nullptr);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {  // a match or heap limit: the rest stays one piece (tokenized, not split)
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      spdlog::warn("pre-tokenizer regex failed on {} bytes of text, left unsplit: {}", text.size() - gap,
                   reinterpret_cast<const char*>(message));
      break;
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    const size_t start = ov[0], end = ov[1];
    if (end == start) {  // an empty match splits nothing: search again one character on
      pos = start + Utf8Length(static_cast<uint8_t>(text[start]));
      continue;
    }
    if (start > gap) piece(text.substr(gap, start - gap));
    piece(text.substr(start, end - start));
    gap = pos = end;
  }
  if (gap < text.size()) piece(text.substr(gap));
}

size_t ValidUtf8PrefixLength(std::string_view text) {
  const auto* s = reinterpret_cast<const uint8_t*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    if (i + 8 <= n) {  // eight ASCII bytes at a time
      uint64_t word;
      std::memcpy(&word, s + i, 8);
      if ((word & 0x8080808080808080ULL) == 0) {
        i += 8;
        continue;
      }
    }
    const uint8_t b = s[i];
    if (b < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint8_t lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) {
      len = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
      len = 3;
      if (b == 0xE0) lo = 0xA0;
      if (b == 0xED) hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
      len = 4;
      if (b == 0xF0) lo = 0x90;
      if (b == 0xF4) hi = 0x8F;
    } else {
      return i;
    }
    if (i + len > n) return i;
    if (s[i + 1] < lo || s[i + 1] > hi) return i;
    for (size_t k = 2; k < len; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) return i;
    }
    i += len;
  }
  return n;
}

}  // namespace lazykv
