// Lazy paged decode attention on the GPU against two baselines measured in the same run:
// the device-to-device copy rate (the bandwidth ceiling) and the same kernel with every
// delta 0 (rotation off: one query rotation per split instead of one per chunk).
// Shape: Llama-3-8B attention (32 query heads, 8 KV heads, head dim 128), bf16 KV in
// blocks of 16, documents of 512 tokens each at its own delta.
// usage: cuda_decode_bench   (prints a table; run on a GPU machine)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>

#include "common/model_config.h"
#include "kernels/cuda/lazy_decode_attention.h"

namespace {

#define CHECK_CUDA(expr)                                                                    \
  do {                                                                                      \
    cudaError_t e = (expr);                                                                 \
    if (e != cudaSuccess) {                                                                 \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e)); \
      std::exit(1);                                                                         \
    }                                                                                       \
  } while (0)

template <typename T>
T* Upload(const std::vector<T>& v) {
  T* d;
  CHECK_CUDA(cudaMalloc(&d, v.size() * sizeof(T)));
  CHECK_CUDA(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

template <typename Fn>
float MedianMs(Fn&& fn, int reps = 30) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int i = 0; i < 3; ++i) fn();
  std::vector<float> times;
  for (int i = 0; i < reps; ++i) {
    cudaEventRecord(a);
    fn();
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms;
    cudaEventElapsedTime(&ms, a, b);
    times.push_back(ms);
  }
  std::nth_element(times.begin(), times.begin() + reps / 2, times.end());
  return times[reps / 2];
}

}  // namespace

int main() {
  using namespace lazykv;
  constexpr int kHeads = 32, kKvHeads = 8, kHd = 128, kBlock = 16, kDoc = 512;
  RopeConfig rope;
  rope.style = RopeStyle::kRotateHalf;
  rope.theta = 500000;
  rope.llama3_scaling = true;
  double* inv_freq = Upload(RopeInverseFrequencies(rope, kHd));

  // Ceiling: a large device-to-device copy (bytes read + bytes written per second).
  const size_t copy_bytes = size_t{2} << 30;
  void *src, *dst;
  CHECK_CUDA(cudaMalloc(&src, copy_bytes));
  CHECK_CUDA(cudaMalloc(&dst, copy_bytes));
  const float copy_ms = MedianMs([&] { cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice); }, 10);
  const double copy_gbs = 2.0 * copy_bytes / copy_ms / 1e6;
  CHECK_CUDA(cudaFree(src));
  CHECK_CUDA(cudaFree(dst));
  std::printf("device-to-device copy: %.0f GB/s (read + write)\n", copy_gbs);
  std::printf("%5s %7s %7s %10s %10s %9s %12s %12s\n", "batch", "context", "splits", "lazy_us", "no_rot_us",
              "lazy_GB/s", "vs_copy", "rotation_cost");

  std::mt19937 rng(1);
  for (int batch : {1, 32, 64}) {
    for (int context : {4096, 16384, 32768}) {
      const int blocks_per_seq = context / kBlock;
      const size_t num_blocks = static_cast<size_t>(batch) * blocks_per_seq;
      const size_t pool_elems = num_blocks * kBlock * kKvHeads * kHd;
      if (pool_elems * 2 * 2 > (size_t{60} << 30)) continue;
      void *k, *v;
      CHECK_CUDA(cudaMalloc(&k, pool_elems * 2));
      CHECK_CUDA(cudaMalloc(&v, pool_elems * 2));
      CHECK_CUDA(cudaMemset(k, 0x3c, pool_elems * 2));  // small finite bf16 values
      CHECK_CUDA(cudaMemset(v, 0x3c, pool_elems * 2));
      std::vector<int32_t> ids, tokens, lazy_deltas, zero_deltas, starts, offsets = {0}, positions;
      for (int s = 0; s < batch; ++s) {
        // Each document lands at a random offset: one delta per 512-token document.
        std::vector<int32_t> doc_delta(context / kDoc + 1);
        for (int32_t& d : doc_delta) d = static_cast<int32_t>(rng() % 100000);
        for (int b = 0; b < blocks_per_seq; ++b) {
          ids.push_back(s * blocks_per_seq + b);
          tokens.push_back(kBlock);
          const int doc = b * kBlock / kDoc;
          lazy_deltas.push_back(doc_delta[doc]);
          zero_deltas.push_back(0);
          starts.push_back(b * kBlock);
        }
        offsets.push_back(static_cast<int32_t>(ids.size()));
        positions.push_back(context - 1);
      }
      std::vector<float> q(static_cast<size_t>(batch) * kHeads * kHd, 0.01f);
      cuda::DecodeAttentionParams p;
      p.q = Upload(q);
      p.k_pool = k;
      p.v_pool = v;
      p.block_ids = Upload(ids);
      p.block_tokens = Upload(tokens);
      p.block_starts = Upload(starts);
      p.table_offsets = Upload(offsets);
      p.positions = Upload(positions);
      p.inv_freq = inv_freq;
      p.num_seqs = batch;
      p.n_heads = kHeads;
      p.n_kv_heads = kKvHeads;
      p.head_dim = kHd;
      p.block_size = kBlock;
      p.rope_style = 1;
      p.max_entries_per_seq = blocks_per_seq;
      const int splits = cuda::ChooseDecodeSplits(p);
      CHECK_CUDA(cudaMalloc(&p.workspace, cuda::DecodeWorkspaceBytes(p, splits)));
      CHECK_CUDA(cudaMalloc(&p.out, q.size() * sizeof(float)));
      int32_t* d_lazy = Upload(lazy_deltas);
      int32_t* d_zero = Upload(zero_deltas);
      p.block_deltas = d_lazy;
      const float lazy_ms = MedianMs([&] { cuda::LaunchLazyDecodeAttention(p, nullptr); });
      p.block_deltas = d_zero;
      const float plain_ms = MedianMs([&] { cuda::LaunchLazyDecodeAttention(p, nullptr); });
      CHECK_CUDA(cudaGetLastError());
      const double kv_bytes = 2.0 * pool_elems * 2;
      const double gbs = kv_bytes / lazy_ms / 1e6;
      std::printf("%5d %7d %7d %10.1f %10.1f %9.0f %11.0f%% %11.1f%%\n", batch, context, splits, lazy_ms * 1e3,
                  plain_ms * 1e3, gbs, 100.0 * gbs / copy_gbs, 100.0 * (lazy_ms / plain_ms - 1.0));
      for (const void* ptr : {(const void*)p.q, (const void*)p.block_ids, (const void*)p.block_tokens,
                              (const void*)p.block_starts, (const void*)p.table_offsets, (const void*)p.positions,
                              (const void*)p.workspace, (const void*)p.out, (const void*)d_lazy, (const void*)d_zero,
                              (const void*)k, (const void*)v}) {
        cudaFree(const_cast<void*>(ptr));
      }
    }
  }
  return 0;
}
