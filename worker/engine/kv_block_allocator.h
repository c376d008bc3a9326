// Refcounted allocator of the paged KV pool's physical blocks. A block is freed when
// its last holder (a sequence or the cache index) lets go. Not thread-safe: one engine's
// scheduling thread owns it.
//
// Blocks are handed out lowest first, and a run of consecutive blocks can be asked for at once
// (AllocateRun): the prefill kernels read a KV tile of consecutive pool slots as one TMA copy
// (kernels/cuda/lazy_prefill_specialized.cuh, IssueTileLoad), so a document's blocks in one run
// are read faster than the same blocks scattered over the pool.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace lazykv {

class KvBlockAllocator {
 public:
  explicit KvBlockAllocator(int num_blocks);

  // The lowest free block with refcount 1, or nullopt when none is free.
  std::optional<int32_t> Allocate();
  // The first of the lowest `count` consecutive free blocks, each with refcount 1, or nullopt
  // when no such run is free (nothing is allocated then). REQUIRES: count >= 1.
  std::optional<int32_t> AllocateRun(int count);
  // REQUIRES: `block` is allocated (refcount > 0); aborts otherwise (a use after free in
  // the engine's bookkeeping must never reach a kernel).
  void Ref(int32_t block);
  // REQUIRES: `block` is allocated; aborts otherwise. Frees it with the last reference.
  void Unref(int32_t block);

  // REQUIRES: 0 <= block < num_blocks().
  int refcount(int32_t block) const { return refcounts_[block]; }
  int num_free() const { return num_free_; }
  int num_blocks() const { return static_cast<int>(refcounts_.size()); }
  // The most blocks allocated at once so far.
  int peak_allocated() const { return peak_allocated_; }

 private:
  // The first block at or after `from` that is free (want_free) or allocated (!want_free), or
  // num_blocks() when none is.
  int32_t NextWith(int32_t from, bool want_free) const;
  // Takes blocks [first, first + count), all free.
  void TakeRun(int32_t first, int count);

  std::vector<int32_t> refcounts_;
  std::vector<uint64_t> free_bits_;  // bit b % 64 of word b / 64: block b is free
  int first_free_word_ = 0;          // no word before it has a free block
  int num_free_ = 0;
  int peak_allocated_ = 0;
};

}  // namespace lazykv
