// StagingPool without CUDA: host buffers only.
#include "worker/tier/staging_pool.h"

namespace lazykv {

absl::StatusOr<char*> StagingPool::AllocateDevice(int device, uint64_t) {
  return absl::FailedPreconditionError("staging on a GPU: this build has no CUDA");
}

void StagingPool::FreeDevice(int, char*) {}

}  // namespace lazykv
