// RMSNorm fused with the residual add on the GPU (CPU twins: cpu::AddInPlace, cpu::RmsNorm).
// One CTA per row. Where the row is whole float4s that fit the CTA's registers (dims up to
// 8192, multiples of 4), every load of the row is issued before any arithmetic, so a decode
// step's one-row norm costs one trip to memory rather than one per element (10.5 us a call
// on the H100 before, in bench/cuda_backend_bench --kernel-trace). Other rows take the
// scalar kernel: the add and the sum of squares in one pass over x, the scaling in a second.
#include "common/env_switch.h"
#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/element_access.cuh"
#include "kernels/cuda/model_ops.h"

namespace lazykv::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kVecThreads = 512;
constexpr int kVecPerThread = 4;  // float4s a thread holds: rows up to 4 * 4 * 512 = 8192

// The CTA's sum of v over its kNumThreads threads (every thread gets it).
template <int kNumThreads>
__device__ __forceinline__ float BlockSum(float v) {
  __shared__ float partial[kNumThreads / 32];
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < kNumThreads / 32; ++w) total += partial[w];
  return total;
}

template <typename T>
__global__ void ResidualRmsNormKernel(float* __restrict__ x, const float* __restrict__ residual,
                                      const float* __restrict__ weight, int dim, float eps, T* __restrict__ out) {
  AllowDependentLaunch();
  WaitForPriorGrid();
  const size_t base = static_cast<size_t>(blockIdx.x) * dim;
  float* xr = x + base;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < dim; i += kThreads) {
    float v = xr[i];
    if (residual != nullptr) {
      v += residual[base + i];
      xr[i] = v;
    }
    ss += v * v;
  }
  const float scale = rsqrtf(BlockSum<kThreads>(ss) / dim + eps);
  for (int i = threadIdx.x; i < dim; i += kThreads) out[base + i] = FromFloat<T>(weight[i] * (xr[i] * scale));
}

__device__ __forceinline__ void Store4(float* out, float4 v) { *reinterpret_cast<float4*>(out) = v; }
__device__ __forceinline__ void Store4(__nv_bfloat16* out, float4 v) {
  const __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
  uint2 packed;
  packed.x = *reinterpret_cast<const uint32_t*>(&lo);
  packed.y = *reinterpret_cast<const uint32_t*>(&hi);
  *reinterpret_cast<uint2*>(out) = packed;
}

// Preconditions: dim % 4 == 0, dim <= 4 * kVecPerThread * kVecThreads, x, residual, weight
// and out 16-byte aligned (8-byte for bf16 out). With kWeightsEarly, `weight` is loaded
// before waiting for the kernel before (a dependent launch starts this one beside that
// kernel's tail), so it must not be written by the kernels this one follows: model weights.
template <typename T, bool kWeightsEarly>
__global__ void __launch_bounds__(kVecThreads)
    ResidualRmsNormVecKernel(float* __restrict__ x, const float* __restrict__ residual,
                             const float* __restrict__ weight, int dim, float eps, T* __restrict__ out) {
  AllowDependentLaunch();
  const int n4 = dim / 4;
  const float4* w4 = reinterpret_cast<const float4*>(weight);
  float4 w[kVecPerThread];
  if constexpr (kWeightsEarly) {
#pragma unroll
    for (int j = 0; j < kVecPerThread; ++j) {
      const int i = threadIdx.x + j * kVecThreads;
      w[j] = i < n4 ? w4[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  }
  WaitForPriorGrid();
  const size_t base = static_cast<size_t>(blockIdx.x) * dim;
  float4* xr = reinterpret_cast<float4*>(x + base);
  const float4* rr = residual != nullptr ? reinterpret_cast<const float4*>(residual + base) : nullptr;
  float4 v[kVecPerThread], r[kVecPerThread];
#pragma unroll
  for (int j = 0; j < kVecPerThread; ++j) {
    const int i = threadIdx.x + j * kVecThreads;
    v[j] = i < n4 ? xr[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    r[j] = rr != nullptr && i < n4 ? rr[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < kVecPerThread; ++j) {
    const int i = threadIdx.x + j * kVecThreads;
    if (rr != nullptr) {
      v[j] = make_float4(v[j].x + r[j].x, v[j].y + r[j].y, v[j].z + r[j].z, v[j].w + r[j].w);
      if (i < n4) xr[i] = v[j];
    }
    ss += v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
  }
  const float scale = rsqrtf(BlockSum<kVecThreads>(ss) / dim + eps);
#pragma unroll
  for (int j = 0; j < kVecPerThread; ++j) {
    const int i = threadIdx.x + j * kVecThreads;
    if (i < n4) {
      if constexpr (!kWeightsEarly) w[j] = w4[i];
      Store4(out + base + 4 * static_cast<size_t>(i),
             make_float4(w[j].x * (v[j].x * scale), w[j].y * (v[j].y * scale), w[j].z * (v[j].z * scale),
                         w[j].w * (v[j].w * scale)));
    }
  }
}

bool Aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

template <typename T>
cudaError_t ResidualRmsNorm(float* x, const float* residual, const float* weight, int rows, int dim, float eps, T* out,
                            cudaStream_t stream) {
  if (rows < 0 || dim <= 0) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  if (dim % 4 == 0 && dim <= 4 * kVecPerThread * kVecThreads && Aligned(x, 16) && Aligned(residual, 16) &&
      Aligned(weight, 16) && Aligned(out, 4 * sizeof(T))) {
    // The weights' loads overlap the kernel before (LAZYKV_NORM_WEIGHTS_EARLY=0: after the wait,
    // for comparisons in one binary).
    static const bool early = EnvSwitchOn("LAZYKV_NORM_WEIGHTS_EARLY");
    if (early) {
      return LaunchDependent(ResidualRmsNormVecKernel<T, true>, rows, kVecThreads, 0, stream, x, residual, weight, dim,
                             eps, out);
    }
    return LaunchDependent(ResidualRmsNormVecKernel<T, false>, rows, kVecThreads, 0, stream, x, residual, weight, dim,
                           eps, out);
  }
  return LaunchDependent(ResidualRmsNormKernel<T>, rows, kThreads, 0, stream, x, residual, weight, dim, eps, out);
}

}  // namespace

cudaError_t LaunchResidualRmsNorm(float* x, const float* residual, const float* weight, int rows, int dim, float eps,
                                  __nv_bfloat16* out, cudaStream_t stream) {
  return ResidualRmsNorm(x, residual, weight, rows, dim, eps, out, stream);
}
cudaError_t LaunchResidualRmsNorm(float* x, const float* residual, const float* weight, int rows, int dim, float eps,
                                  float* out, cudaStream_t stream) {
  return ResidualRmsNorm(x, residual, weight, rows, dim, eps, out, stream);
}

}  // namespace lazykv::cuda
