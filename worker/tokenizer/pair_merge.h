// The merge loop both BPE tokenizers share (llama2.c scores, tokenizer.json ranks): merge
// adjacent symbols, best pair first and the leftmost on ties, until no pair merges. A heap of
// candidate pairs over a linked list of symbols makes it O(n log n); a candidate is stale
// once either of its symbols has changed.
#pragma once

#include <cstdint>
#include <optional>
#include <queue>
#include <vector>

namespace lazykv {

// What merging a pair gives: lower `priority` merges first.
template <typename Priority>
struct PairMerge {
  Priority priority;
  int32_t merged;
};

// Merges `ids` and appends the result to `out`. `find(left_id, right_id)` returns the pair's
// std::optional<PairMerge<P>> (nullopt: the pair never merges).
template <typename Priority, typename FindMerge>
void MergeAdjacentPairs(std::vector<int32_t> ids, const FindMerge& find, std::vector<int32_t>& out) {
  const int n = static_cast<int>(ids.size());
  std::vector<int32_t> next(n), prev(n);
  for (int i = 0; i < n; ++i) {
    next[i] = i + 1 < n ? i + 1 : -1;
    prev[i] = i - 1;
  }
  struct Candidate {
    Priority priority;
    int32_t left, left_id, right_id, merged;
  };
  struct Later {  // heap order: lowest priority first, then the leftmost
    bool operator()(const Candidate& a, const Candidate& b) const {
      return a.priority != b.priority ? a.priority > b.priority : a.left > b.left;
    }
  };
  std::vector<Candidate> storage;
  storage.reserve(n);
  std::priority_queue<Candidate, std::vector<Candidate>, Later> heap(Later{}, std::move(storage));
  auto consider = [&](int left) {
    if (left < 0 || next[left] < 0) return;
    const int right = next[left];
    const std::optional<PairMerge<Priority>> m = find(ids[left], ids[right]);
    if (m) heap.push(Candidate{m->priority, left, ids[left], ids[right], m->merged});
  };
  for (int i = 0; i + 1 < n; ++i) consider(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    const int right = next[c.left];
    if (ids[c.left] != c.left_id || right < 0 || ids[right] != c.right_id) continue;  // stale
    ids[c.left] = c.merged;
    ids[right] = -1;  // removed
    next[c.left] = next[right];
    if (next[right] >= 0) prev[next[right]] = c.left;
    consider(prev[c.left]);
    consider(c.left);
  }
  for (int i = n > 0 ? 0 : -1; i >= 0; i = next[i]) out.push_back(ids[i]);
}

}  // namespace lazykv
