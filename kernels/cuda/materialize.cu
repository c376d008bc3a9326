// The block baseline's materialize on the GPU (the CPU twin is cpu::CopyBlockRotated).
// It moves as many bytes as a device copy, so it is written like one: a CTA per (copy,
// layer), 16-byte loads and stores, and the rotation's sines and cosines (one per
// frequency: a copy has a single delta) formed once per CTA in shared memory.
#include <cuda_bf16.h>

#include "kernels/cuda/element_access.cuh"
#include "kernels/cuda/materialize.h"
#include "kernels/cuda/rope_device.cuh"

namespace lazykv::cuda {
namespace {

using Vec = uint4;  // 16 bytes

template <typename T>
__device__ __forceinline__ void Rotate(T& x0, T& x1, float2 sin_cos) {
  const float a = ToFloat(x0), b = ToFloat(x1);
  x0 = FromFloat<T>(a * sin_cos.y - b * sin_cos.x);
  x1 = FromFloat<T>(a * sin_cos.x + b * sin_cos.y);
}

template <typename T>
__global__ void MaterializeKernel(MaterializeParams p, bool vectorized) {
  constexpr int kVec = sizeof(Vec) / sizeof(T);
  extern __shared__ float2 sin_cos[];  // [head_dim / 2]: (sin, cos) of delta * inv_freq[i]
  const int copy = blockIdx.x, layer = blockIdx.y;
  const int src = p.src_blocks[copy], dst = p.dst_blocks[copy], delta = p.deltas[copy];
  int n = p.num_tokens[copy];
  const int hd = p.kv.head_dim, half = hd / 2;
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    float s, c;
    RopeSinCos(p.kv.inv_freq[i], delta, &s, &c);
    sin_cos[i] = make_float2(s, c);
  }
  __syncthreads();
  const size_t slot_width = static_cast<size_t>(p.kv.n_kv_heads) * hd;
  const size_t layer_offset = static_cast<size_t>(layer) * p.pool_blocks * p.kv.block_size * slot_width;
  T* k = static_cast<T*>(p.kv.k_pool) + layer_offset;
  T* v = static_cast<T*>(p.kv.v_pool) + layer_offset;
  // Slots [first, n): the bases move to the first slot, and n - first slots are copied.
  const int first = p.first_slots != nullptr ? p.first_slots[copy] : 0;
  const size_t src_base = (static_cast<size_t>(src) * p.kv.block_size + first) * slot_width;
  const size_t dst_base = (static_cast<size_t>(dst) * p.kv.block_size + first) * slot_width;
  n -= first;
  const int rows = n * p.kv.n_kv_heads;  // row = slot * n_kv_heads + head
  const bool interleaved = p.kv.rope_style == RopeStyle::kInterleaved;

  if (!vectorized) {  // shapes whose rows are not whole 16-byte vectors (small test models)
    for (int idx = threadIdx.x; idx < rows * half; idx += blockDim.x) {
      const int i = idx % half;
      int a, b;
      RopePair(p.kv.rope_style, hd, i, &a, &b);
      const size_t r = static_cast<size_t>(idx / half) * hd;
      T x0 = k[src_base + r + a], x1 = k[src_base + r + b];
      Rotate(x0, x1, sin_cos[i]);
      k[dst_base + r + a] = x0;
      k[dst_base + r + b] = x1;
    }
    for (size_t idx = threadIdx.x; idx < static_cast<size_t>(n) * slot_width; idx += blockDim.x) {
      v[dst_base + idx] = v[src_base + idx];
    }
    return;
  }
  if (interleaved) {  // a vector holds kVec / 2 whole pairs (2i, 2i + 1)
    const int per_row = hd / kVec;
    for (int unit = threadIdx.x; unit < rows * per_row; unit += blockDim.x) {
      const size_t offset = static_cast<size_t>(unit / per_row) * hd + (unit % per_row) * kVec;
      Vec x = *reinterpret_cast<const Vec*>(k + src_base + offset);
      T* e = reinterpret_cast<T*>(&x);
      const int first = static_cast<int>(offset % hd) / 2;
#pragma unroll
      for (int j = 0; j < kVec; j += 2) Rotate(e[j], e[j + 1], sin_cos[first + j / 2]);
      *reinterpret_cast<Vec*>(k + dst_base + offset) = x;
    }
  } else {  // rotate-half: a vector of the first half pairs with the same columns of the second
    const int per_row = half / kVec;
    for (int unit = threadIdx.x; unit < rows * per_row; unit += blockDim.x) {
      const int column = (unit % per_row) * kVec;
      const size_t offset = static_cast<size_t>(unit / per_row) * hd + column;
      Vec lo = *reinterpret_cast<const Vec*>(k + src_base + offset);
      Vec hi = *reinterpret_cast<const Vec*>(k + src_base + offset + half);
      T* a = reinterpret_cast<T*>(&lo);
      T* b = reinterpret_cast<T*>(&hi);
#pragma unroll
      for (int j = 0; j < kVec; ++j) Rotate(a[j], b[j], sin_cos[column + j]);
      *reinterpret_cast<Vec*>(k + dst_base + offset) = lo;
      *reinterpret_cast<Vec*>(k + dst_base + offset + half) = hi;
    }
  }
  const Vec* v_src = reinterpret_cast<const Vec*>(v + src_base);
  Vec* v_dst = reinterpret_cast<Vec*>(v + dst_base);
  for (size_t unit = threadIdx.x; unit < static_cast<size_t>(n) * slot_width / kVec; unit += blockDim.x) {
    v_dst[unit] = v_src[unit];
  }
}

}  // namespace

cudaError_t LaunchMaterialize(const MaterializeParams& p, cudaStream_t stream) {
  if (p.num_copies == 0 || p.num_layers == 0) return cudaSuccess;
  if (p.num_copies < 0 || p.kv.head_dim % 2 != 0 || p.kv.block_size <= 0 || p.num_layers < 0 || p.num_layers > 65535 ||
      (p.num_layers > 1 && p.pool_blocks <= 0)) {
    return cudaErrorInvalidValue;
  }
  const dim3 grid(p.num_copies, p.num_layers);
  const size_t shared = static_cast<size_t>(p.kv.head_dim / 2) * sizeof(float2);
  WithElementType(p.kv.element, [&](auto t) {
    using T = decltype(t);
    // Vectors need whole 16-byte pieces: a row (interleaved) or a half row (rotate-half),
    // from 16-byte aligned pools.
    const size_t piece = (p.kv.rope_style == RopeStyle::kInterleaved ? p.kv.head_dim : p.kv.head_dim / 2) * sizeof(T);
    const bool vectorized = piece % sizeof(Vec) == 0 && reinterpret_cast<uintptr_t>(p.kv.k_pool) % sizeof(Vec) == 0 &&
                            reinterpret_cast<uintptr_t>(p.kv.v_pool) % sizeof(Vec) == 0;
    MaterializeKernel<T><<<grid, 256, shared, stream>>>(p, vectorized);
  });
  return cudaGetLastError();
}

}  // namespace lazykv::cuda
