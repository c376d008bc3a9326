#include "worker/tokenizer/bpe_model.h"

#include "worker/tokenizer/pair_merge.h"

namespace lazykv {

BpeModel::BpeModel(absl::flat_hash_map<std::string, int32_t> vocab, const std::array<int32_t, 256>& byte_ids,
                   const std::vector<Merge>& merges, bool ignore_merges)
    : vocab_(std::move(vocab)), byte_ids_(byte_ids), ignore_merges_(ignore_merges) {
  ranks_.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    ranks_.insert_or_assign(PairKey(merges[i].left, merges[i].right),
                            Ranked{static_cast<int32_t>(i), merges[i].merged});
  }
}

void BpeModel::EncodeWord(std::string_view word, std::vector<int32_t>& out) const {
  if (word.size() == 1) {
    out.push_back(byte_ids_[static_cast<uint8_t>(word[0])]);
    return;
  }
  if (ignore_merges_) {
    if (auto it = vocab_.find(absl::string_view(word.data(), word.size())); it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  if (word.size() <= kShortWord) {
    MergeShort(word, out);
  } else {
    MergeLong(word, out);
  }
}

// Symbols and the rank of each adjacent pair in arrays; each step scans the ranks for the
// lowest and closes the gap (cheap at this size; every pair is looked up once or twice).
void BpeModel::MergeShort(std::string_view word, std::vector<int32_t>& out) const {
  int32_t ids[kShortWord];
  Ranked pairs[kShortWord];  // pairs[i]: the merge of ids[i] and ids[i + 1]
  size_t n = word.size();
  for (size_t i = 0; i < n; ++i) ids[i] = byte_ids_[static_cast<uint8_t>(word[i])];
  for (size_t i = 0; i + 1 < n; ++i) pairs[i] = Find(ids[i], ids[i + 1]);
  while (n > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < n; ++i) {
      if (pairs[i].rank < pairs[best].rank) best = i;
    }
    if (pairs[best].rank == kNone) break;
    ids[best] = pairs[best].merged;
    for (size_t i = best + 1; i + 1 < n; ++i) ids[i] = ids[i + 1];
    for (size_t i = best + 1; i + 2 < n; ++i) pairs[i] = pairs[i + 1];
    --n;
    if (best > 0) pairs[best - 1] = Find(ids[best - 1], ids[best]);
    if (best + 1 < n) pairs[best] = Find(ids[best], ids[best + 1]);
  }
  out.insert(out.end(), ids, ids + n);
}

// The lowest rank merges first (worker/tokenizer/pair_merge.h).
void BpeModel::MergeLong(std::string_view word, std::vector<int32_t>& out) const {
  std::vector<int32_t> ids(word.size());
  for (size_t i = 0; i < word.size(); ++i) ids[i] = byte_ids_[static_cast<uint8_t>(word[i])];
  MergeAdjacentPairs<int32_t>(
      std::move(ids),
      [this](int32_t left, int32_t right) -> std::optional<PairMerge<int32_t>> {
        const Ranked m = Find(left, right);
        if (m.rank == kNone) return std::nullopt;
        return PairMerge<int32_t>{m.rank, m.merged};
      },
      out);
}

}  // namespace lazykv
