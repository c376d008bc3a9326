// Receive buffers for chunks that arrive over a peer link (common/peer_link/): device
// memory on the worker's GPU for an NCCL link, host memory for its socket twin. Buffers are
// kept for reuse rather than freed (cudaMalloc and cudaFree wait for the device); the bytes
// outstanding and kept are bounded.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/mutex.h"

namespace lazykv {

// One buffer, back in its pool when the last holder lets go.
class StagingBuffer {
 public:
  virtual ~StagingBuffer() = default;
  virtual char* data() const = 0;
  virtual uint64_t size() const = 0;  // at least what was asked for
  // Seconds Acquire spent allocating it (0 for a kept buffer): a one-time cost, not the
  // transport's, which fetch estimates leave out.
  virtual double allocation_seconds() const = 0;
};

// Thread-safe; the buffers it hands out may outlive it.
class StagingPool : public std::enable_shared_from_this<StagingPool> {
 public:
  // `device` >= 0: device memory on that GPU (FAILED_PRECONDITION at Acquire in a build
  // without CUDA); -1: host memory. At most `max_bytes` handed out and kept together.
  static std::shared_ptr<StagingPool> Create(int device, uint64_t max_bytes);
  ~StagingPool();

  // A buffer of at least `bytes` (a kept one when one fits, else a new one).
  // RESOURCE_EXHAUSTED when it would pass max_bytes even after dropping every kept buffer;
  // the allocator's error otherwise.
  absl::StatusOr<std::shared_ptr<StagingBuffer>> Acquire(uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t outstanding_bytes() const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t kept_bytes() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Block {
    char* data;
    uint64_t size;
  };
  class Lent;
  StagingPool(int device, uint64_t max_bytes) : device_(device), max_bytes_(max_bytes) {}
  void GiveBack(Block block) ABSL_LOCKS_EXCLUDED(mu_);

  // The memory itself (staging_pool_cuda.cc; staging_pool_none.cc without CUDA).
  static absl::StatusOr<char*> AllocateDevice(int device, uint64_t bytes);
  static void FreeDevice(int device, char* data);
  absl::StatusOr<char*> Allocate(uint64_t bytes);
  void Free(char* data);

  const int device_;
  const uint64_t max_bytes_;
  mutable Mutex mu_;
  std::vector<Block> kept_ ABSL_GUARDED_BY(mu_);
  uint64_t kept_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t outstanding_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace lazykv
