// Finds added tokens (Hugging Face tokenizer.json `added_tokens`, e.g. "<|eot_id|>") in
// raw text before pre-tokenization, as Hugging Face's AddedVocabulary does: leftmost
// match first, the longest of those starting there; the text between matches is
// tokenized normally.
//
// Immutable after construction: Split may be called from any number of threads.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"

namespace lazykv {

class AddedTokenMatcher {
 public:
  // (text, id) pairs with non-empty, distinct texts.
  explicit AddedTokenMatcher(const std::vector<std::pair<std::string, int32_t>>& tokens);

  // Calls `text` for each non-empty stretch without an added token and `token` for each
  // added token, in order.
  void Split(std::string_view input, absl::FunctionRef<void(std::string_view)> text,
             absl::FunctionRef<void(int32_t)> token) const;

  bool empty() const { return ids_.size() <= 1; }

 private:
  // A byte trie: node 0 is the root; edges (node << 8 | byte) -> child; ids_[node] is the
  // token that ends there, or -1.
  absl::flat_hash_map<uint64_t, int32_t> edges_;
  std::vector<int32_t> ids_;
  std::array<bool, 256> first_{};  // bytes that start some token
  int distinct_first_ = 0;
  char only_first_ = 0;  // the one starting byte, when distinct_first_ == 1 (memchr)
};

}  // namespace lazykv
