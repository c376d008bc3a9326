// RoPE on the device: the pair of dimensions for frequency i under each style, and a
// rotation whose angle is formed in double precision (exact at positions up to 2^31).
#pragma once

#include <cuda_runtime.h>

namespace lazykv::cuda {

__device__ __forceinline__ void RopePair(int style, int head_dim, int i, int* a, int* b) {
  if (style == 0) {
    *a = 2 * i;
    *b = 2 * i + 1;
  } else {
    *a = i;
    *b = i + head_dim / 2;
  }
}

__device__ __forceinline__ void RopeSinCos(double inv_freq, long long position, float* s, float* c) {
  double sd, cd;
  sincos(static_cast<double>(position) * inv_freq, &sd, &cd);
  *s = static_cast<float>(sd);
  *c = static_cast<float>(cd);
}

}  // namespace lazykv::cuda
