// RoPE on the device: the pair of dimensions for frequency i under each style, and a
// rotation whose angle is formed in double precision (exact at positions up to 2^31).
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda/element_access.cuh"
#include "kernels/cuda/paged_kv.h"

namespace lazykv::cuda {

__device__ __forceinline__ void RopePair(RopeStyle style, int head_dim, int i, int* a, int* b) {
  if (style == RopeStyle::kInterleaved) {
    *a = 2 * i;
    *b = 2 * i + 1;
  } else {
    *a = i;
    *b = i + head_dim / 2;
  }
}

// The angle is formed and reduced to [-pi, pi] in double (two FP64 operations), so the
// float sine and cosine see an exact argument even at positions near 2^31.
__device__ __forceinline__ void RopeSinCos(double inv_freq, long long position, float* s, float* c) {
  const double angle = static_cast<double>(position) * inv_freq;
  const double turns = rint(angle * 0.15915494309189535);  // 1 / (2 pi)
  const float reduced = static_cast<float>(fma(-turns, 6.283185307179586, angle));
  sincosf(reduced, s, c);
}

// A key's pair (a, b) rotated by the angle whose sine and cosine are s and c, stored as T:
// the KV write's arithmetic, shared by its kernel (kv_write.cu) and the decode kernel's
// fused write, which must agree bit for bit.
template <typename T>
__device__ __forceinline__ void StoreRotatedPair(const float* __restrict__ k, int a, int b, float s, float c,
                                                 T* __restrict__ out) {
  const float x0 = k[a], x1 = k[b];
  out[a] = FromFloat<T>(x0 * c - x1 * s);
  out[b] = FromFloat<T>(x0 * s + x1 * c);
}

}  // namespace lazykv::cuda
