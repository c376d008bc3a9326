// Refcounted allocator of the paged KV pool's physical blocks. A block is freed when
// its last holder (a sequence or the cache index) lets go. Not thread-safe: one engine's
// scheduling thread owns it.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace lazykv {

class KvBlockAllocator {
 public:
  explicit KvBlockAllocator(int num_blocks);

  // A free block with refcount 1 (the most recently freed first), or nullopt when none
  // is free.
  std::optional<int32_t> Allocate();
  // REQUIRES: `block` is allocated (refcount > 0); aborts otherwise (a use after free in
  // the engine's bookkeeping must never reach a kernel).
  void Ref(int32_t block);
  // REQUIRES: `block` is allocated; aborts otherwise. Frees it with the last reference.
  void Unref(int32_t block);

  // REQUIRES: 0 <= block < num_blocks().
  int refcount(int32_t block) const { return refcounts_[block]; }
  int num_free() const { return static_cast<int>(free_.size()); }
  int num_blocks() const { return static_cast<int>(refcounts_.size()); }
  // The most blocks allocated at once so far.
  int peak_allocated() const { return peak_allocated_; }

 private:
  std::vector<int32_t> refcounts_;
  std::vector<int32_t> free_;  // a stack: recently freed blocks are reused first
  int peak_allocated_ = 0;
};

}  // namespace lazykv
