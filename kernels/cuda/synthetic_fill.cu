// Synthetic weights drawn on the GPU with the CPU's exact generator (MakeSyntheticWeights):
// SplitMix64 is counter-based, so value i is a function of (state, i) and every thread
// computes its own. Float operations are rounded explicitly so no FMA contraction changes a
// bit against the CPU.
#include <algorithm>

#include "kernels/cuda/model_ops.h"

namespace lazykv::cuda {
namespace {

__global__ void SyntheticFillKernel(uint64_t state, size_t n, float scale, bool is_norm, __nv_bfloat16* out_bf16,
                                    float* out_fp32) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint64_t z = state + (i + 1) * 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    const double unit = __dmul_rn(static_cast<double>(z >> 11), 0x1.0p-53);
    const float u = static_cast<float>(__dsub_rn(__dmul_rn(unit, 2.0), 1.0));
    const float v = is_norm ? __fadd_rn(1.0f, __fmul_rn(0.1f, u)) : __fmul_rn(scale, u);
    if (out_bf16 != nullptr) out_bf16[i] = __float2bfloat16(v);
    if (out_fp32 != nullptr) out_fp32[i] = v;
  }
}

}  // namespace

cudaError_t LaunchSyntheticFill(uint64_t state, size_t n, float scale, bool is_norm, __nv_bfloat16* out_bf16,
                                float* out_fp32, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const unsigned grid = static_cast<unsigned>(std::min<size_t>((n + 255) / 256, 1 << 16));
  SyntheticFillKernel<<<grid, 256, 0, stream>>>(state, n, scale, is_norm, out_bf16, out_fp32);
  return cudaGetLastError();
}

}  // namespace lazykv::cuda
