// Generic lazy paged attention (see generic_attention.h). Keys are visited one block-table
// entry at a time, in tiles of kThreads slots: each thread scores one key (a dot product
// over the head dim), the CTA folds the tile into its running max and sum, then each thread
// accumulates its share of the head dims over the tile's values.
#include <cuda_bf16.h>

#include <cfloat>

#include "kernels/cuda/element_access.cuh"
#include "kernels/cuda/generic_attention.h"
#include "kernels/cuda/rope_device.cuh"

namespace lazykv::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kMaxHeadDim = 1024;
constexpr int kDimsPerThread = kMaxHeadDim / kThreads;

__device__ float BlockMax(float v, float* scratch) {
  for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  float m = scratch[0];
  for (int w = 1; w < kThreads / 32; ++w) m = fmaxf(m, scratch[w]);
  return m;
}

__device__ float BlockSum(float v, float* scratch) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  float s = 0.0f;
  for (int w = 0; w < kThreads / 32; ++w) s += scratch[w];
  return s;
}

template <typename T>
__global__ void GenericAttentionKernel(PrefillAttentionParams p, float scale) {
  const int row = blockIdx.x, head = blockIdx.y;
  const PagedKv& kv = p.kv;
  const int hd = kv.head_dim, half = hd / 2;
  // The query's sequence: the last s with query_offsets[s] <= row.
  int lo = 0, hi = p.num_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (p.query_offsets[mid] <= row)
      lo = mid;
    else
      hi = mid - 1;
  }
  const int seq = lo;
  const long long position = static_cast<long long>(p.query_pos0[seq]) + (row - p.query_offsets[seq]);
  const int kv_head = head / (p.n_heads / kv.n_kv_heads);
  const size_t kv_width = static_cast<size_t>(kv.n_kv_heads) * hd;
  const float* q_raw = p.q + (static_cast<size_t>(row) * p.n_heads + head) * hd;
  const T* k_pool = static_cast<const T*>(kv.k_pool);
  const T* v_pool = static_cast<const T*>(kv.v_pool);

  __shared__ float q_rot[kMaxHeadDim];
  __shared__ float probs[kThreads];
  __shared__ float scratch[kThreads / 32];
  float acc[kDimsPerThread];
  for (int j = 0; j < kDimsPerThread; ++j) acc[j] = 0.0f;
  float running_max = -FLT_MAX, running_sum = 0.0f;
  bool have_rotation = false;
  int rotated_delta = 0;

  for (int e = kv.table_offsets[seq]; e < kv.table_offsets[seq + 1]; ++e) {
    const int start = kv.block_starts[e];
    if (start > position) break;
    const int delta = kv.block_deltas[e];
    if (!have_rotation || delta != rotated_delta) {
      __syncthreads();  // every thread is done with the previous rotation
      for (int i = threadIdx.x; i < half; i += kThreads) {
        int a, b;
        RopePair(kv.rope_style, hd, i, &a, &b);
        float s, c;
        RopeSinCos(kv.inv_freq[i], position - delta, &s, &c);
        q_rot[a] = q_raw[a] * c - q_raw[b] * s;
        q_rot[b] = q_raw[a] * s + q_raw[b] * c;
      }
      __syncthreads();
      have_rotation = true;
      rotated_delta = delta;
    }
    const int visible = static_cast<int>(min(static_cast<long long>(kv.block_tokens[e]), position - start + 1));
    const size_t block_base = static_cast<size_t>(kv.block_ids[e]) * kv.block_size * kv_width + kv_head * hd;
    for (int t0 = 0; t0 < visible; t0 += kThreads) {
      const int t = t0 + threadIdx.x;
      float score = -FLT_MAX;
      if (t < visible) {
        const T* k = k_pool + block_base + static_cast<size_t>(t) * kv_width;
        float dot = 0.0f;
        for (int d = 0; d < hd; ++d) dot += q_rot[d] * ToFloat(k[d]);
        score = dot * scale;
      }
      const float tile_max = BlockMax(score, scratch);
      const float new_max = fmaxf(running_max, tile_max);
      const float correction = __expf(running_max - new_max);
      const float prob = t < visible ? __expf(score - new_max) : 0.0f;
      running_sum = running_sum * correction + BlockSum(prob, scratch);
      running_max = new_max;
      probs[threadIdx.x] = prob;
      __syncthreads();
      const int tile = min(kThreads, visible - t0);
      for (int j = 0; j < kDimsPerThread; ++j) {
        const int d = threadIdx.x + j * kThreads;
        if (d >= hd) break;
        float a = acc[j] * correction;
        const T* v = v_pool + block_base + static_cast<size_t>(t0) * kv_width + d;
        for (int u = 0; u < tile; ++u) a += probs[u] * ToFloat(v[static_cast<size_t>(u) * kv_width]);
        acc[j] = a;
      }
      __syncthreads();  // probs is rewritten by the next tile
    }
  }
  float* out = p.out + (static_cast<size_t>(row) * p.n_heads + head) * hd;
  const float inv = running_sum > 0.0f ? 1.0f / running_sum : 0.0f;
  for (int j = 0; j < kDimsPerThread; ++j) {
    const int d = threadIdx.x + j * kThreads;
    if (d < hd) out[d] = acc[j] * inv;
  }
}

}  // namespace

cudaError_t LaunchGenericPagedAttention(const PrefillAttentionParams& p, int total_queries, cudaStream_t stream) {
  const PagedKv& kv = p.kv;
  if (p.num_seqs <= 0 || p.n_heads <= 0 || p.n_heads > 65535 || kv.n_kv_heads <= 0 || p.n_heads % kv.n_kv_heads != 0 ||
      kv.head_dim <= 0 || kv.head_dim % 2 != 0 || kv.head_dim > kMaxHeadDim || kv.block_size <= 0 ||
      (kv.rope_style != RopeStyle::kInterleaved && kv.rope_style != RopeStyle::kRotateHalf) || total_queries < 0) {
    return cudaErrorInvalidValue;
  }
  if (total_queries == 0) return cudaSuccess;
  const float scale = 1.0f / sqrtf(static_cast<float>(kv.head_dim));
  const dim3 grid(total_queries, p.n_heads);
  WithElementType(kv.element,
                  [&](auto t) { GenericAttentionKernel<decltype(t)><<<grid, kThreads, 0, stream>>>(p, scale); });
  return cudaGetLastError();
}

}  // namespace lazykv::cuda
