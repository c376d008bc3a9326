// A build without CUDA: the GPU tier runs emulated only (device_arena.h).
#include "cache_server/device_arena.h"

namespace lazykv::cache {

absl::StatusOr<std::unique_ptr<DeviceArena>> DeviceArena::CreateOnGpu(uint64_t, uint64_t, int) {
  return absl::FailedPreconditionError("GPU tier: this build has no CUDA");
}

}  // namespace lazykv::cache
