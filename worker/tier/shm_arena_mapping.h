// A cache server's shared host arena, mapped read-only by a worker on the same host (the
// same-host transport, DESIGN.md section 5). The server's arena is a memfd sealed
// against resizing (cache_server/host_arena.h); the worker opens it through
// /proc/<server pid>/fd/<fd>, which the kernel allows only to a process of the same user
// in the same PID namespace (the same rule as reading the server's memory: no new
// exposure), and checks that it runs on the server's host (the kernel's boot id) and that
// what it opened is that arena (device and inode, size): a worker on another host, or in
// another PID namespace where the pid names another process, fails here and uses gRPC.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/chunk_bytes.h"

namespace lazykv {

struct ShmArenaIdentity {
  int server_pid = 0;
  int arena_fd = -1;
  uint64_t arena_bytes = 0;
  uint64_t page_bytes = 0;
  uint64_t dev = 0;  // st_dev, st_ino of the arena's file in the server
  uint64_t ino = 0;
  std::string boot_id;  // the server host's (common/shm_host_id.h); must equal this host's
};

// Page-locks a read-only mapping for fast device copies (set by worker/setup to the CUDA
// backend's cudaHostRegister with the read-only flag); `pin` returns whether it did.
struct HostPinner {
  std::function<bool(const void* base, size_t bytes)> pin;
  std::function<void(const void* base)> unpin;
};

// Immutable once mapped: safe to read from several threads. Unmapped when the last
// holder lets go (chunk bytes handed out keep it through their owner).
class ShmArenaMapping {
 public:
  // FAILED_PRECONDITION when the arena cannot be opened or is not the one named (another
  // host, another PID namespace, another user), INVALID_ARGUMENT for a malformed identity.
  // With `pinner` (may be null), the mapping is page-locked when it can be (pinned()).
  static absl::StatusOr<std::shared_ptr<const ShmArenaMapping>> Map(const ShmArenaIdentity& identity,
                                                                    const HostPinner* pinner = nullptr);
  ~ShmArenaMapping();
  ShmArenaMapping(const ShmArenaMapping&) = delete;
  ShmArenaMapping& operator=(const ShmArenaMapping&) = delete;

  uint64_t bytes() const { return bytes_; }
  uint64_t page_bytes() const { return page_bytes_; }
  uint64_t num_pages() const { return bytes_ / page_bytes_; }
  bool pinned() const { return unpin_ != nullptr; }

  // The pieces of a value of `size` bytes stored in `pages` (in order; byte b at page
  // pages[b / page_bytes]), adjacent pages merged into one piece. INVALID_ARGUMENT when
  // the page count does not match the size or a page is outside the arena.
  absl::StatusOr<std::vector<std::string_view>> Pieces(std::span<const uint32_t> pages, uint64_t size) const;

  // Pages the server reserved for a publication from this worker, mapped writable (only
  // they: a stray write cannot reach another chunk), covering `size` bytes in order.
  // Unmapped when the returned object goes. FAILED_PRECONDITION when the arena could not
  // be opened for writing here; INVALID_ARGUMENT as Pieces.
  class WritablePages {
   public:
    ~WritablePages();
    WritablePages(const WritablePages&) = delete;
    WritablePages& operator=(const WritablePages&) = delete;
    const MutablePieces& pieces() const { return pieces_; }

   private:
    friend class ShmArenaMapping;
    WritablePages() = default;
    std::vector<std::span<char>> maps_;  // each mmap'ed run of pages
    MutablePieces pieces_;
  };
  absl::StatusOr<std::unique_ptr<WritablePages>> MapWritable(std::span<const uint32_t> pages, uint64_t size) const;

 private:
  ShmArenaMapping(const char* base, uint64_t bytes, uint64_t page_bytes)
      : base_(base), bytes_(bytes), page_bytes_(page_bytes) {}
  const char* const base_;
  const uint64_t bytes_;
  const uint64_t page_bytes_;
  std::function<void(const void*)> unpin_;  // set when pinned
  int rw_fd_ = -1;                           // the arena opened for writing; -1: publish over gRPC
};

}  // namespace lazykv
