// The new tokens' K/V into the paged pool, keys rotated at their stored position, and
// their q split out of the fused QKV output, raw or rotated at the query's position
// (KvWriteParams::q_positions; CPU twin: the RotateHeads + memcpy in the CPU backend's
// ForwardOne).
#include <cstdint>

#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/element_access.cuh"
#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/rope_device.cuh"

namespace lazykv::cuda {
namespace {

constexpr int kThreads = 256;

// One CTA per row. Pointers are __restrict__ so the row's loads go out together rather than
// one store's round trip apart (10 us a decode step's row on the H100 before, in
// bench/cuda_backend_bench --kernel-trace); q is copied in float4s where the row allows.
template <typename T>
__global__ void __launch_bounds__(kThreads) KvWriteKernel(KvWriteParams p) {
  AllowDependentLaunch();
  WaitForPriorGrid();
  T* __restrict__ k_pool = static_cast<T*>(p.kv.k_pool);
  T* __restrict__ v_pool = static_cast<T*>(p.kv.v_pool);
  const int r = blockIdx.x;
  const int hd = p.kv.head_dim, half = hd / 2;
  const int q_dim = p.n_heads * hd, kv_dim = p.kv.n_kv_heads * hd;
  const size_t row_stride = static_cast<size_t>(q_dim) + 2 * kv_dim;
  const float* __restrict__ row = p.qkv + static_cast<size_t>(r) * row_stride;
  float* __restrict__ q_out = p.q_out + static_cast<size_t>(r) * q_dim;
  const size_t slot = (static_cast<size_t>(p.slot_blocks[r]) * p.kv.block_size + p.slot_index[r]) * kv_dim;
  // Whole float4s when both rows start 16-byte aligned (row_stride and q_dim multiples of 4).
  const bool vec = q_dim % 4 == 0 && row_stride % 4 == 0 && reinterpret_cast<uintptr_t>(p.qkv) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(p.q_out) % 16 == 0;
  if (p.q_positions != nullptr && r >= p.rotated_q_from) {
    // R(position) q (the keys' arithmetic, StoreRotatedPair, in fp32): each frequency's sine and
    // cosine made once into shared memory, then a thread per (head, frequency) pair. (A thread per
    // frequency and run of heads, each making its own, took 6.7 against 4.4 us a layer for a
    // 16-row step: bench/results/prefill_query_2026-11-29.md.)
    __shared__ float2 sin_cos[kThreads];  // half <= kThreads (LaunchKvWrite)
    const long long position = p.q_positions[r];
    for (int i = threadIdx.x; i < half; i += kThreads) {
      float s, c;
      RopeSinCos(p.kv.inv_freq[i], position, &s, &c);
      sin_cos[i] = make_float2(s, c);
    }
    __syncthreads();  // the branch is the CTA's (one row a CTA)
    for (int j = threadIdx.x; j < p.n_heads * half; j += kThreads) {
      const int head = j / half, i = j % half;
      int a, b;
      RopePair(p.kv.rope_style, hd, i, &a, &b);
      const float2 sc = sin_cos[i];
      StoreRotatedPair(row + head * hd, a, b, sc.x, sc.y, q_out + head * hd);
    }
  } else if (vec) {
    const float4* __restrict__ src = reinterpret_cast<const float4*>(row);
    float4* __restrict__ dst = reinterpret_cast<float4*>(q_out);
    for (int i = threadIdx.x; i < q_dim / 4; i += kThreads) dst[i] = src[i];
  } else {
    for (int i = threadIdx.x; i < q_dim; i += kThreads) q_out[i] = row[i];
  }
  const float* __restrict__ k = row + q_dim;
  const float* __restrict__ v = row + q_dim + kv_dim;
  for (int i = threadIdx.x; i < kv_dim; i += kThreads) v_pool[slot + i] = FromFloat<T>(v[i]);
  // A thread per (KV head, frequency) pair, each forming its own sine and cosine (the same
  // arithmetic for every head): a thread per frequency looping over the heads waited on one
  // pair's loads after another (6.3 us a layer for a 16-token question, bench/results/
  // mma_tail_2026-11-28.md).
  const long long position = p.rope_positions[r];
  for (int j = threadIdx.x; j < p.kv.n_kv_heads * half; j += kThreads) {
    const int head = j / half, i = j % half;
    int a, b;
    RopePair(p.kv.rope_style, hd, i, &a, &b);
    float s, c;
    RopeSinCos(p.kv.inv_freq[i], position, &s, &c);
    StoreRotatedPair(k + head * hd, a, b, s, c, k_pool + slot + head * hd);
  }
}

}  // namespace

cudaError_t LaunchKvWrite(const KvWriteParams& p, cudaStream_t stream) {
  if (p.rows < 0 || p.n_heads <= 0 || p.kv.n_kv_heads <= 0 || p.kv.head_dim <= 0 || p.kv.head_dim % 2 != 0 ||
      p.kv.block_size <= 0 || (p.q_positions != nullptr && p.kv.head_dim / 2 > kThreads)) {
    return cudaErrorInvalidValue;
  }
  if (p.rows == 0) return cudaSuccess;
  cudaError_t err = cudaSuccess;
  WithElementType(p.kv.element,
                  [&](auto t) { err = LaunchDependent(KvWriteKernel<decltype(t)>, p.rows, kThreads, 0, stream, p); });
  return err;
}

}  // namespace lazykv::cuda
