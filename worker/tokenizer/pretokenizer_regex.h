// A Hugging Face `Split` pre-tokenizer with behavior "Isolated" (and the regex of a
// ByteLevel pre-tokenizer with use_regex): every match of a regex is one piece, and so is
// every stretch of text between two matches. The regex is compiled by PCRE2 with UTF and
// UCP (Unicode \p{L}, \p{N}, case-insensitive groups, look-ahead), JIT-compiled where PCRE2
// can. `\s` and `\S` are rewritten to Unicode's White_Space property, which is what Hugging
// Face's tokenizers match (PCRE2's own \s would also take U+180E).
//
// Immutable after Compile: Split may be called from any number of threads.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"

struct pcre2_real_code_8;

namespace lazykv {

class PretokenizerRegex {
 public:
  // INVALID_ARGUMENT, with PCRE2's message and offset, for a pattern it cannot compile.
  static absl::StatusOr<PretokenizerRegex> Compile(std::string_view pattern);

  // Calls `piece` for each match and each non-empty gap between matches, in text order:
  // the pieces concatenate to `text`. Text that is not valid UTF-8 is still split: each
  // byte outside a valid UTF-8 character is a piece of its own, and the regex splits the
  // valid stretches between them.
  void Split(std::string_view text, absl::FunctionRef<void(std::string_view)> piece) const;

  // The pattern as PCRE2 compiled it (after the \s rewrite).
  const std::string& compiled_pattern() const { return pattern_; }
  bool jit() const { return jit_; }

 private:
  struct CodeDeleter {
    void operator()(pcre2_real_code_8* code) const;
  };
  PretokenizerRegex(std::string pattern, pcre2_real_code_8* code, bool jit)
      : pattern_(std::move(pattern)), code_(code), jit_(jit) {}

  void SplitValid(std::string_view text, absl::FunctionRef<void(std::string_view)> piece) const;

  std::string pattern_;
  std::unique_ptr<pcre2_real_code_8, CodeDeleter> code_;
  bool jit_ = false;
};

// The length of the longest prefix of `text` that is valid UTF-8 (RFC 3629: no overlong
// forms, surrogates or code points past U+10FFFF).
size_t ValidUtf8PrefixLength(std::string_view text);

}  // namespace lazykv
