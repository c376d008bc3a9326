// Host RAM for the cache tier: one region cut into fixed-size pages. A value is a list
// of pages, so any free page serves any value and MiB-sized churn never fragments the
// region; at most one partial page is wasted per value. The region is pinned for fast
// GPU copies when a CUDA device is present (pinned_memory.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/mutex.h"

namespace lazykv::cache {

// Thread-safe: pages are allocated and freed from any thread. The bytes of a page belong
// to whoever holds it (a HostValue); the arena never touches them.
class HostArena {
 public:
  // capacity is rounded down to whole pages.
  static absl::StatusOr<std::unique_ptr<HostArena>> Create(uint64_t capacity_bytes, uint64_t page_bytes,
                                                           bool pin_for_gpu);
  ~HostArena();
  HostArena(const HostArena&) = delete;
  HostArena& operator=(const HostArena&) = delete;

  uint64_t page_bytes() const { return page_bytes_; }
  uint64_t num_pages() const { return num_pages_; }
  uint64_t capacity_bytes() const { return page_bytes_ * num_pages_; }
  bool pinned() const { return pinned_; }
  uint64_t PagesFor(uint64_t bytes) const { return (bytes + page_bytes_ - 1) / page_bytes_; }

  // Takes `n` free pages, or returns false (taking none) when fewer are free.
  bool TryAllocate(uint64_t n, std::vector<uint32_t>* pages);
  void Free(std::span<const uint32_t> pages);
  uint64_t free_pages() const;
  // Blocks until at least `n` pages are free or `deadline` passes; true if they are.
  bool WaitForFreePages(uint64_t n, std::chrono::steady_clock::time_point deadline);

  char* page(uint32_t index) const { return base_ + static_cast<size_t>(index) * page_bytes_; }

 private:
  HostArena(char* base, uint64_t page_bytes, uint64_t num_pages, bool pinned);

  char* const base_;
  const uint64_t page_bytes_;
  const uint64_t num_pages_;
  const bool pinned_;
  mutable Mutex mu_;
  CondVar freed_;                                    // free_ grew
  std::vector<uint32_t> free_ ABSL_GUARDED_BY(mu_);  // LIFO: recently freed pages are still warm in cache
};

// One value in the arena. Pages go back to the arena when the last holder lets go, so a
// reader keeps an evicted value's bytes alive until it has sent them. Not synchronized:
// one writer fills it before it is shared; afterwards any number of threads read it.
class HostValue {
 public:
  HostValue(HostArena* arena, std::vector<uint32_t> pages, uint64_t size)
      : arena_(arena), pages_(std::move(pages)), size_(size) {}
  ~HostValue() { arena_->Free(pages_); }
  HostValue(const HostValue&) = delete;
  HostValue& operator=(const HostValue&) = delete;

  uint64_t size() const { return size_; }
  void Write(uint64_t offset, std::string_view bytes);
  void Read(uint64_t offset, uint64_t length, char* out) const;
  // Contiguous pieces covering [offset, offset + length), in order.
  std::vector<std::string_view> Pieces(uint64_t offset, uint64_t length) const;
  // The whole value's pages as writable pieces, for its one writer (before it is shared).
  std::vector<std::span<char>> WritablePieces();

 private:
  HostArena* arena_;
  std::vector<uint32_t> pages_;
  uint64_t size_;
};

}  // namespace lazykv::cache
