// StagingPool's device memory, where CUDA is built.
#include <cuda_runtime.h>

#include "absl/strings/str_format.h"
#include "worker/tier/staging_pool.h"

namespace lazykv {

absl::StatusOr<char*> StagingPool::AllocateDevice(int device, uint64_t bytes) {
  int previous = 0;
  cudaGetDevice(&previous);
  cudaSetDevice(device);
  void* data = nullptr;
  const cudaError_t e = cudaMalloc(&data, bytes);
  cudaSetDevice(previous);
  if (e != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it for the next call
    return absl::ResourceExhaustedError(
        absl::StrFormat("staging: cudaMalloc of %d bytes on GPU %d: %s", bytes, device, cudaGetErrorString(e)));
  }
  return static_cast<char*>(data);
}

void StagingPool::FreeDevice(int device, char* data) {
  int previous = 0;
  cudaGetDevice(&previous);
  cudaSetDevice(device);
  cudaFree(data);
  cudaSetDevice(previous);
}

}  // namespace lazykv
