// Where shm_fetch_bench --device puts a fetched chunk: device memory, by the steps the CUDA
// backend's StageChunk takes (the piece copy kernel with the value check where the device
// can address every piece, else a batched copy and the check; on a stream of its own; a
// synchronize), and the ceiling those steps are held to: the
// same copy from a pinned host buffer of the bench's own. Without CUDA in the build or a
// device, Create says so.
#pragma once

#include <memory>
#include <span>
#include <string_view>

#include "absl/status/statusor.h"

namespace lazykv::bench {

// Not thread-safe.
class DeviceSink {
 public:
  // `copy_engines`: always the batched copy and the check after (the path before the piece
  // copy kernel), to compare the two in one run.
  static absl::StatusOr<std::unique_ptr<DeviceSink>> Create(size_t bytes, bool copy_engines = false);
  virtual ~DeviceSink() = default;
  // Copies `pieces` (at most `bytes` in all) to the device, checks the values (bf16), and
  // waits. DATA_LOSS for a non-finite value.
  virtual absl::Status Consume(std::span<const std::string_view> pieces) = 0;
  // The ceiling: `bytes` from pinned host memory to the device, and waits.
  virtual absl::Status CopyFromPinned(size_t bytes) = 0;
  // The ceiling of a device-to-device fetch: `bytes` from another buffer on the device.
  virtual absl::Status CopyFromDevice(size_t bytes) = 0;
  // The first `bytes` the sink holds, back on the host (checks).
  virtual absl::Status ReadBack(size_t bytes, char* out) = 0;
  virtual std::string Describe() const = 0;
};

}  // namespace lazykv::bench
