#include <cstdint>

#include "kernels/cuda/dependent_launch.cuh"
#include "tests/kernels/slow_copy.h"

namespace lazykv::testing {
namespace {

__device__ uint64_t GlobalNanos() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void SlowCopyKernel(const unsigned char* src, unsigned char* dst, size_t bytes, unsigned delay_ns) {
  cuda::AllowDependentLaunch();
  cuda::WaitForPriorGrid();
  const uint64_t until = GlobalNanos() + delay_ns;
  while (GlobalNanos() < until) __nanosleep(1000);
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < bytes;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    dst[i] = src[i];
  }
}

}  // namespace

cudaError_t LaunchSlowCopy(const void* src, void* dst, size_t bytes, unsigned delay_ns, cudaStream_t stream) {
  return cuda::LaunchDependent(SlowCopyKernel, dim3(8), dim3(256), 0, stream, static_cast<const unsigned char*>(src),
                               static_cast<unsigned char*>(dst), bytes, delay_ns);
}

}  // namespace lazykv::testing
