#include <cuda_bf16.h>

#include "bench/prefill_bench_device.h"

namespace lazykv::bench {
namespace {

__device__ float HashUniform(uint64_t i, uint64_t seed) {
  uint64_t z = i * 0x9E3779B97F4A7C15ull + seed;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * (1.0f / 16777216.0f) * 4.0f - 2.0f;
}

__global__ void FillBf16Kernel(__nv_bfloat16* x, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    x[i] = __float2bfloat16(HashUniform(i, seed));
  }
}

__global__ void FillF32Kernel(float* x, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    x[i] = HashUniform(i, seed);
  }
}

constexpr int kPeakIters = 4096;
constexpr int kPeakThreads = 256;

// 8 independent accumulators per warp, operands in registers.
__global__ void MmaPeakKernel(float* sink) {
  uint32_t a[4], b[2];
  for (int i = 0; i < 4; ++i) a[i] = 0x3f803f80u ^ (threadIdx.x * 2654435761u + i);
  for (int i = 0; i < 2; ++i) b[i] = 0x3f803f80u ^ (threadIdx.x * 40503u + i);
  float d[8][4] = {};
  for (int it = 0; it < kPeakIters; ++it) {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      asm volatile(
          "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
          "{%0, %1, %2, %3};\n"
          : "+f"(d[k][0]), "+f"(d[k][1]), "+f"(d[k][2]), "+f"(d[k][3])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
  }
  float s = 0;
  for (int k = 0; k < 8; ++k) s += d[k][0] + d[k][1] + d[k][2] + d[k][3];
  if (s == 12345.678f) sink[0] = s;  // keeps the loop alive
}

}  // namespace

cudaError_t FillRandomBf16(void* x, size_t n, uint64_t seed) {
  FillBf16Kernel<<<1024, 256>>>(static_cast<__nv_bfloat16*>(x), n, seed);
  return cudaGetLastError();
}

cudaError_t FillRandomF32(float* x, size_t n, uint64_t seed) {
  FillF32Kernel<<<1024, 256>>>(x, n, seed);
  return cudaGetLastError();
}

cudaError_t MmaPeak(int sms, double* gflop) {
  static float* sink = nullptr;
  if (sink == nullptr) {
    const cudaError_t err = cudaMalloc(&sink, sizeof(float));
    if (err != cudaSuccess) return err;
  }
  const int blocks = sms * 8;
  MmaPeakKernel<<<blocks, kPeakThreads>>>(sink);
  *gflop = double(blocks) * (kPeakThreads / 32) * kPeakIters * 8 * (2.0 * 16 * 8 * 16) / 1e9;
  return cudaGetLastError();
}

}  // namespace lazykv::bench
