#include "worker/engine/kv_block_allocator.h"

#include <algorithm>
#include <bit>
#include <cstdlib>

#include "spdlog/spdlog.h"

namespace lazykv {

KvBlockAllocator::KvBlockAllocator(int num_blocks)
    : refcounts_(num_blocks, 0), free_bits_((num_blocks + 63) / 64, ~uint64_t{0}), num_free_(num_blocks) {
  if (num_blocks % 64 != 0) free_bits_.back() = (uint64_t{1} << (num_blocks % 64)) - 1;  // no blocks past the end
}

int32_t KvBlockAllocator::NextWith(int32_t from, bool want_free) const {
  const int words = static_cast<int>(free_bits_.size());
  int w = from / 64;
  if (w >= words) return num_blocks();
  uint64_t bits = (want_free ? free_bits_[w] : ~free_bits_[w]) & (~uint64_t{0} << (from % 64));
  while (bits == 0) {
    if (++w >= words) return num_blocks();
    bits = want_free ? free_bits_[w] : ~free_bits_[w];
  }
  return std::min(num_blocks(), w * 64 + std::countr_zero(bits));
}

void KvBlockAllocator::TakeRun(int32_t first, int count) {
  for (int32_t b = first; b < first + count; ++b) {
    free_bits_[b / 64] &= ~(uint64_t{1} << (b % 64));
    refcounts_[b] = 1;
  }
  num_free_ -= count;
  while (first_free_word_ < static_cast<int>(free_bits_.size()) && free_bits_[first_free_word_] == 0) {
    ++first_free_word_;
  }
  peak_allocated_ = std::max(peak_allocated_, num_blocks() - num_free_);
}

std::optional<int32_t> KvBlockAllocator::Allocate() { return AllocateRun(1); }

std::optional<int32_t> KvBlockAllocator::AllocateRun(int count) {
  if (count < 1 || count > num_free_) return std::nullopt;
  const int32_t n = num_blocks();
  for (int32_t b = NextWith(first_free_word_ * 64, true); b < n;) {
    const int32_t end = NextWith(b, false);  // the run of free blocks [b, end)
    if (end - b >= count) {
      TakeRun(b, count);
      return b;
    }
    b = NextWith(end, true);
  }
  return std::nullopt;
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
  if (--refcounts_[block] == 0) {
    free_bits_[block / 64] |= uint64_t{1} << (block % 64);
    first_free_word_ = std::min(first_free_word_, block / 64);
    ++num_free_;
  }
}

}  // namespace lazykv
