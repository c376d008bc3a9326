// Host RAM for the cache tier: one region cut into fixed-size pages. A value is a list
// of pages, so any free page serves any value and MiB-sized churn never fragments the
// region; at most one partial page is wasted per value. The region is pinned for fast
// GPU copies when a CUDA device is present (pinned_memory.h). A shared arena is a memfd
// (sealed against resizing) that a worker on the same host maps read-only (the same-host
// transport, DESIGN.md section 5: kv_cache_shm.cc); otherwise it is private memory.
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
  // capacity is rounded down to whole pages. `shared`: back the region with a memfd that
  // other processes can map; when the kernel refuses one (no memfd_create), the arena is
  // private and says so (shared() false), with a warning.
  static absl::StatusOr<std::unique_ptr<HostArena>> Create(uint64_t capacity_bytes, uint64_t page_bytes,
                                                           bool pin_for_gpu, bool shared = false);
  ~HostArena();
  HostArena(const HostArena&) = delete;
  HostArena& operator=(const HostArena&) = delete;

  uint64_t page_bytes() const { return page_bytes_; }
  uint64_t num_pages() const { return num_pages_; }
  uint64_t capacity_bytes() const { return page_bytes_ * num_pages_; }
  bool pinned() const { return pinned_; }
  // The memfd behind a shared arena (-1 when private): other processes of the same user
  // open it as /proc/<pid>/fd/<fd>. Its device and inode identify it.
  bool shared() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  uint64_t file_dev() const { return file_dev_; }
  uint64_t file_ino() const { return file_ino_; }
  uint64_t PagesFor(uint64_t bytes) const { return (bytes + page_bytes_ - 1) / page_bytes_; }

  // Takes `n` free pages, or returns false (taking none) when fewer are free.
  bool TryAllocate(uint64_t n, std::vector<uint32_t>* pages);
  void Free(std::span<const uint32_t> pages);
  uint64_t free_pages() const;
  // Blocks until at least `n` pages are free or `deadline` passes; true if they are.
  bool WaitForFreePages(uint64_t n, std::chrono::steady_clock::time_point deadline);

  char* page(uint32_t index) const { return base_ + static_cast<size_t>(index) * page_bytes_; }

 private:
  HostArena(char* base, uint64_t page_bytes, uint64_t num_pages, bool pinned, int fd);

  char* const base_;
  const int fd_;  // -1: private memory
  uint64_t file_dev_ = 0;
  uint64_t file_ino_ = 0;
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
  // The value's pages, in order: byte b is at page pages()[b / page_bytes].
  std::span<const uint32_t> pages() const { return pages_; }
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
