#include "worker/engine/kv_block_allocator.h"

#include <algorithm>
#include <cstdlib>

#include "spdlog/spdlog.h"

namespace lazykv {

KvBlockAllocator::KvBlockAllocator(int num_blocks) : refcounts_(num_blocks, 0) {
  free_.reserve(num_blocks);
  for (int32_t b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

std::optional<int32_t> KvBlockAllocator::Allocate() {
  if (free_.empty()) return std::nullopt;
  const int32_t block = free_.back();
  free_.pop_back();
  refcounts_[block] = 1;
  peak_allocated_ = std::max(peak_allocated_, num_blocks() - num_free());
  return block;
}

void KvBlockAllocator::Ref(int32_t block) {
  if (refcounts_[block] <= 0) {
    spdlog::critical("KV block {} referenced while free", block);
    std::abort();  // a use-after-free in the engine's bookkeeping: never continue
  }
  ++refcounts_[block];
}

void KvBlockAllocator::Unref(int32_t block) {
  if (refcounts_[block] <= 0) {
    spdlog::critical("KV block {} released more often than taken", block);
    std::abort();
  }
  if (--refcounts_[block] == 0) free_.push_back(block);
}

}  // namespace lazykv
