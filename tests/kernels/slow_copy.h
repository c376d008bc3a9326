// A kernel for tests of dependent launches (kernels/cuda/dependent_launch.cuh): it writes its
// output late. Launched as a dependent launch, it lets the next kernel's CTAs in at once
// (AllowDependentLaunch), waits for the kernel before it, spins for about `delay_ns`, then
// copies `bytes` from src to dst. A dependent kernel after it that read dst before its own
// WaitForPriorGrid() would read what dst held before.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace lazykv::testing {

cudaError_t LaunchSlowCopy(const void* src, void* dst, size_t bytes, unsigned delay_ns, cudaStream_t stream);

}  // namespace lazykv::testing
