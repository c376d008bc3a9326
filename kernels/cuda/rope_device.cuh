// RoPE on the device: the pair of dimensions for frequency i under each style, and a
// rotation whose angle is formed in double precision (exact at positions up to 2^31).
#pragma once

#include <cuda_runtime.h>

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

}  // namespace lazykv::cuda
