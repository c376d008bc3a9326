// A byte-level BPE tokenizer, as a Hugging Face tokenizer.json describes one (GPT-2,
// Llama 3; loaded by LoadHfTokenizer): added tokens are found in the raw text first; the
// text between them is split by the pre-tokenizer regexes, and each piece's bytes are
// merged by the BPE model. The byte-level alphabet never shows here: the model works on
// bytes directly (the loader translates the vocabulary once).
//
// Decode concatenates each id's bytes: an added token gives its text, an id with no token
// (or out of range) nothing. The result need not be valid UTF-8 where ids end inside a
// character (1352 Llama 3 tokens are partial characters); a caller that streams sanitizes
// it, as it does for llama2.c's byte-fallback tokens. Encode(Decode(...)) round-trips any
// text, and any bytes: a byte that is not part of valid UTF-8 is a word of its own.
//
// Immutable after construction: Encode and Decode may be called from any number of threads.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "worker/tokenizer/added_token_matcher.h"
#include "worker/tokenizer/bpe_model.h"
#include "worker/tokenizer/pretokenizer_regex.h"
#include "worker/tokenizer/tokenizer.h"

namespace lazykv {

class ByteLevelBpeTokenizer : public Tokenizer {
 public:
  // `regexes` split in order (each splits the pieces of the one before); `token_bytes[id]`
  // is what Decode writes for id (its size is the vocabulary size).
  ByteLevelBpeTokenizer(BpeModel model, std::vector<PretokenizerRegex> regexes, AddedTokenMatcher added,
                        const std::vector<std::string>& token_bytes);

  std::vector<int32_t> Encode(std::string_view text) const override;
  std::string Decode(std::span<const int32_t> ids) const override;
  int vocab_size() const override { return static_cast<int>(offsets_.size()) - 1; }

 private:
  void EncodeText(std::string_view text, size_t regex, std::vector<int32_t>& out) const;

  BpeModel model_;
  std::vector<PretokenizerRegex> regexes_;
  AddedTokenMatcher added_;
  std::string bytes_;              // every token's bytes, back to back
  std::vector<uint32_t> offsets_;  // token id's bytes: bytes_[offsets_[id], offsets_[id + 1])
};

}  // namespace lazykv
