// CudaIpcMapping in a build without CUDA: never opened.
#include "worker/tier/cuda_ipc_mapping.h"

namespace lazykv {

absl::StatusOr<std::shared_ptr<const CudaIpcMapping>> CudaIpcMapping::Open(std::string_view, std::string_view, int,
                                                                           uint64_t, uint64_t) {
  return absl::FailedPreconditionError("GPU tier: this build has no CUDA");
}

CudaIpcMapping::~CudaIpcMapping() = default;

}  // namespace lazykv
