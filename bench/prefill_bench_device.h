// Device helpers of cuda_prefill_bench (nvcc builds them in C++17; the benchmark itself
// is C++20): random fills and the mma.sync ceiling.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace lazykv::bench {

// Uniform values in [-2, 2) from a hash of (index, seed): never zeros, never the same
// pattern twice.
cudaError_t FillRandomBf16(void* x, size_t n, uint64_t seed);
cudaError_t FillRandomF32(float* x, size_t n, uint64_t seed);

// Launches a pure mma.sync m16n8k16 bf16 loop over all SMs; *gflop gets the work done
// by one launch (in GFLOP, so GFLOP / ms = TFLOP/s).
cudaError_t MmaPeak(int sms, double* gflop);

}  // namespace lazykv::bench
