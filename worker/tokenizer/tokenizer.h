// Text <-> token ids. Encode adds no BOS/EOS; Decode is Encode's inverse (it drops the
// leading space that SentencePiece-style tokenizers add as a dummy prefix). Decode returns
// bytes that need not be valid UTF-8 where ids end inside a character (byte fallback,
// byte-level tokens); streaming callers sanitize them.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace lazykv {

// Implementations are immutable after loading: Encode and Decode may be called from
// any number of threads (the worker's gRPC handlers do).
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<int32_t> Encode(std::string_view text) const = 0;
  virtual std::string Decode(std::span<const int32_t> ids) const = 0;
  virtual int vocab_size() const = 0;
};

// Text that `ids` add after `prefix`: Decode(prefix + ids) minus Decode(prefix), so that
// spaces between the two are kept (decoding `ids` alone would drop a leading one).
std::string DecodeContinuation(const Tokenizer& tokenizer, std::span<const int32_t> prefix,
                               std::span<const int32_t> ids);

// By the path: a Hugging Face tokenizer.json (any *.json), a SentencePiece .model, else a
// llama2.c tokenizer.bin (BPE with scores, byte fallback). A directory (a Hugging Face
// model directory) is searched for tokenizer.json, then tokenizer.model, then tokenizer.bin.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& path);
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadLlama2cTokenizer(const std::string& path);
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadSentencePieceTokenizer(const std::string& path);
// A Hugging Face tokenizer.json (or a directory holding one) with a byte-level BPE model,
// as GPT-2 and Llama 3 have (worker/tokenizer/byte_level_bpe_tokenizer.h). Anything else
// (another model type, a normalizer, Split behaviors other than Isolated, added tokens with
// lstrip/rstrip/single_word) is INVALID_ARGUMENT naming the field. The post-processor is
// not applied (Encode adds no BOS); truncation and padding are ignored.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadHfTokenizer(const std::string& path);

// UTF-8 bytes as ids 3 + byte (0 unk, 1 BOS, 2 EOS): for synthetic models with no
// tokenizer file. Needs a vocabulary of at least 259 ids.
absl::StatusOr<std::unique_ptr<Tokenizer>> MakeByteTokenizer(int vocab_size);

}  // namespace lazykv
