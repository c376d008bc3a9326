// Device memory for the cache server's GPU tier (DESIGN.md section 5): one allocation on a
// GPU cut into fixed-size pages, as the host arena is, so any free page serves any chunk.
// The allocation is exported once as a CUDA IPC handle: a worker on the same host opens it
// once per session and copies a chunk's pages device to device (its own GPU, or another
// with peer access), with no host memory in between.
//
// The emulated arena keeps its pages in host memory instead and exports no handle: the
// GPU tier's logic (pages, eviction, promotion, demotion, leases, its RPC) runs and is
// tested on machines without a GPU (`--gpu-emulate`, for tests only).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "common/paged_pieces.h"

namespace lazykv::cache {

// Thread-safe: pages are allocated and freed from any thread; Write and Read touch only
// the pages they are given, which belong to the caller (a GpuValue).
class DeviceArena {
 public:
  // capacity is rounded down to whole pages; at least one page. On GPU `device`:
  // FAILED_PRECONDITION without a GPU (or in a build without CUDA), RESOURCE_EXHAUSTED when
  // the device has no room.
  static absl::StatusOr<std::unique_ptr<DeviceArena>> CreateOnGpu(uint64_t capacity_bytes, uint64_t page_bytes,
                                                                  int device);
  static absl::StatusOr<std::unique_ptr<DeviceArena>> CreateEmulated(uint64_t capacity_bytes, uint64_t page_bytes);
  virtual ~DeviceArena() = default;
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  uint64_t page_bytes() const { return page_bytes_; }
  uint64_t num_pages() const { return num_pages_; }
  uint64_t capacity_bytes() const { return page_bytes_ * num_pages_; }
  uint64_t PagesFor(uint64_t bytes) const { return (bytes + page_bytes_ - 1) / page_bytes_; }
  // Takes `n` free pages, or returns false (taking none) when fewer are free. The first run
  // of `n` adjacent free pages when there is one (a chunk in one run moves as one copy or one
  // NCCL send; scattered over 32 pages a 64 MiB chunk crossed GPUs at 0.63x the rate), else
  // the lowest free pages, ascending.
  bool TryAllocate(uint64_t n, std::vector<uint32_t>* pages) ABSL_LOCKS_EXCLUDED(mu_);
  void Free(std::span<const uint32_t> pages) ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t free_pages() const ABSL_LOCKS_EXCLUDED(mu_);

  // Copies host `bytes` to byte `offset` of the value laid out over `pages` (page i holds
  // bytes [i * page_bytes, (i + 1) * page_bytes)); and back. Synchronous.
  virtual absl::Status Write(std::span<const uint32_t> pages, uint64_t offset, std::string_view bytes) = 0;
  virtual absl::Status Read(std::span<const uint32_t> pages, uint64_t offset, uint64_t length, char* out) const = 0;

  virtual bool on_gpu() const = 0;
  virtual int device() const = 0;  // -1 when emulated
  // The whole allocation as a CUDA IPC handle (cudaIpcMemHandle_t's 64 bytes) and the
  // device's UUID (16 bytes): empty when emulated.
  virtual std::string ipc_handle() const = 0;
  virtual std::string device_uuid() const = 0;
  // The allocation's first byte: device memory on a GPU, host memory when emulated.
  virtual const char* base() const = 0;
  // [offset, offset + length) of a value laid out over `pages` as contiguous runs of the
  // allocation (adjacent pages merged): what a peer link sends (common/peer_link/).
  // INVALID_ARGUMENT as PagedPieces (common/paged_pieces.h).
  absl::StatusOr<std::vector<std::string_view>> Pieces(std::span<const uint32_t> pages, uint64_t offset,
                                                       uint64_t length) const {
    return PagedPieces(base(), capacity_bytes(), page_bytes_, pages, offset, length);
  }

 protected:
  DeviceArena(uint64_t page_bytes, uint64_t num_pages);
  // For Write and Read: [offset, offset + length) of a value as runs within its pages, each
  // calling fn(page index, offset in the page, offset in the value's bytes, length).
  template <typename Fn>
  static void ForEachRun(std::span<const uint32_t> pages, uint64_t page_bytes, uint64_t offset, uint64_t length,
                         Fn fn) {
    while (length > 0) {
      const uint64_t page = offset / page_bytes, in_page = offset % page_bytes;
      const uint64_t run = std::min(length, page_bytes - in_page);
      fn(pages[page], in_page, offset, run);
      offset += run;
      length -= run;
    }
  }

 private:
  const uint64_t page_bytes_;
  const uint64_t num_pages_;
  mutable Mutex mu_;
  std::vector<bool> is_free_ ABSL_GUARDED_BY(mu_);  // by page
  uint64_t free_count_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace lazykv::cache
