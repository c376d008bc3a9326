// Byte-pair encoding of one pre-tokenized word (Hugging Face's "BPE" model over bytes):
// start from the word's single bytes, then repeatedly merge the adjacent pair with the
// lowest merge rank (the leftmost of equals) until no pair has a merge. With
// ignore_merges, a word that is itself in the vocabulary is that one token, merges or not
// (Llama 3 sets it). Short words merge in small arrays; long ones (a run of CJK text
// without spaces) with a heap of candidate pairs, O(n log n).
//
// Immutable after construction: EncodeWord may be called from any number of threads.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace lazykv {

class BpeModel {
 public:
  struct Merge {
    int32_t left, right, merged;  // token ids; a merge's rank is its index in the list
  };

  // `vocab`: the bytes of every token merges can reach (at least each single byte, whose
  // ids are `byte_ids`). A pair listed twice keeps its last rank, as Hugging Face does.
  BpeModel(absl::flat_hash_map<std::string, int32_t> vocab, const std::array<int32_t, 256>& byte_ids,
           const std::vector<Merge>& merges, bool ignore_merges);

  // Appends the ids of `word` (non-empty) to `out`.
  void EncodeWord(std::string_view word, std::vector<int32_t>& out) const;

  size_t merge_count() const { return ranks_.size(); }

 private:
  struct Ranked {
    int32_t rank, merged;
  };
  static uint64_t PairKey(int32_t left, int32_t right) {
    return static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32 | static_cast<uint32_t>(right);
  }
  // The merge of (left, right), or rank kNone.
  Ranked Find(int32_t left, int32_t right) const {
    auto it = ranks_.find(PairKey(left, right));
    return it == ranks_.end() ? Ranked{kNone, -1} : it->second;
  }
  void MergeShort(std::string_view word, std::vector<int32_t>& out) const;
  void MergeLong(std::string_view word, std::vector<int32_t>& out) const;

  static constexpr int32_t kNone = INT32_MAX;
  static constexpr size_t kShortWord = 64;  // bytes; longer words use the heap

  absl::flat_hash_map<std::string, int32_t> vocab_;
  std::array<int32_t, 256> byte_ids_;
  absl::flat_hash_map<uint64_t, Ranked> ranks_;  // (left id, right id) -> rank and merged id
  bool ignore_merges_;
};

}  // namespace lazykv
