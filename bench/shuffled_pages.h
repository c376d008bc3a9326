// A chunk's payload as the cache tier's host arena holds it, for the transfer benchmarks:
// fixed-size pages taken from shuffled slots of one region (the arena's free list hands them
// out in no particular order), the first page shared with the chunk header, and no page
// right after the one before (so no two pieces merge into one run).
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

namespace lazykv::bench {

// (offset in the region, length) of each piece of a `bytes`-byte payload, in payload order:
// the first starts `header` bytes into its page. The region holds
// (bytes + header + page - 1) / page pages.
inline std::vector<std::pair<uint64_t, uint64_t>> ShuffledPageLayout(uint64_t bytes, uint64_t page, uint64_t header,
                                                                     std::mt19937_64& rng) {
  const uint64_t num_pages = (bytes + header + page - 1) / page;
  std::vector<uint64_t> slot(num_pages);
  std::iota(slot.begin(), slot.end(), 0);
  std::shuffle(slot.begin(), slot.end(), rng);
  for (size_t i = 0; i + 1 < num_pages; ++i) {
    if (slot[i] + 1 == slot[i + 1]) std::swap(slot[i + 1], slot[(i + 2) % num_pages]);  // rarely adjacent; break it
  }
  std::vector<std::pair<uint64_t, uint64_t>> pieces;
  for (uint64_t at = 0, p = 0, n = page - header; at < bytes; at += n, n = page, ++p) {
    n = std::min(n, bytes - at);
    pieces.emplace_back(slot[p] * page + (p == 0 ? header : 0), n);
  }
  return pieces;
}

}  // namespace lazykv::bench
