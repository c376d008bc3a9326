// Lazy paged decode attention on the GPU against two baselines measured in the same run:
// the device-to-device copy rate (the bandwidth ceiling) and the same kernel with every
// delta 0 (rotation off: one query rotation per warp instead of one per chunk).
// Shape: Llama-3-8B attention (32 query heads, 8 KV heads, head dim 128), bf16 KV in
// blocks of 16 (random normal values), documents of 512 tokens each at its own delta.
//
// usage: cuda_decode_bench [--sweep] [--profile BATCH CONTEXT]
//   (no flag)  the table: per shape, one launch per event pair (lazy_us, no_rot_us) and
//              graph replays of 10 launches (graph_us, as the SDPA reference times itself)
//   --sweep    also the kernel's other launch configurations (warps x stages) per shape
//   --profile  only BATCH x CONTEXT: 2 lazy launches then 2 no-rotation launches (for ncu)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench/cuda_bench_util.h"
#include "common/model_config.h"
#include "kernels/cuda/lazy_decode_attention.h"
#include "kernels/cuda/lazy_decode_attention_config.h"
#include "kernels/cuda/rope_style.h"

namespace {

using lazykv::bench::FillRandomBf16;
using lazykv::bench::GraphMedianMs;
using lazykv::bench::MedianMs;
using lazykv::bench::Upload;

}  // namespace

int main(int argc, char** argv) {
  using namespace lazykv;
  bool sweep = false;
  int profile_batch = 0, profile_context = 0;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--sweep") == 0) {
      sweep = true;
    } else if (std::strcmp(argv[i], "--profile") == 0 && i + 2 < argc) {
      profile_batch = std::atoi(argv[i + 1]);
      profile_context = std::atoi(argv[i + 2]);
      i += 2;
    } else {
      std::fprintf(stderr, "usage: cuda_decode_bench [--sweep] [--profile BATCH CONTEXT]\n");
      return 2;
    }
  }
  const bool profiling = profile_batch > 0;
  constexpr int kHeads = 32, kKvHeads = 8, kHd = 128, kBlock = 16, kDoc = 512;
  RopeConfig rope;
  rope.style = RopeStyle::kRotateHalf;
  rope.theta = 500000;
  rope.llama3_scaling = true;
  double* inv_freq = Upload(RopeInverseFrequencies(rope, kHd));

  double copy_gbs = 0.0;
  if (!profiling) {
    // Ceiling: a large device-to-device copy (bytes read + bytes written per second).
    const size_t copy_bytes = size_t{2} << 30;
    void *src, *dst;
    CHECK_CUDA(cudaMalloc(&src, copy_bytes));
    CHECK_CUDA(cudaMalloc(&dst, copy_bytes));
    const float copy_ms = MedianMs([&] { cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice); }, 10);
    copy_gbs = 2.0 * copy_bytes / copy_ms / 1e6;
    CHECK_CUDA(cudaFree(src));
    CHECK_CUDA(cudaFree(dst));
    std::printf("device-to-device copy: %.0f GB/s (read + write)\n", copy_gbs);
    // merged: the last split merges (DecodeAttentionParams::split_counters), no combine kernel.
    std::printf("%5s %7s %7s %10s %10s %9s %12s %12s %9s %10s %16s\n", "batch", "context", "splits", "lazy_us",
                "no_rot_us", "lazy_GB/s", "vs_copy", "rotation_cost", "graph_us", "merged_us", "merged_graph_us");
  }

  std::vector<std::string> sweep_rows;
  std::mt19937 rng(1);
  std::vector<std::pair<int, int>> shapes;
  if (profiling) {
    shapes.push_back({profile_batch, profile_context});
  } else {
    for (int batch : {1, 32, 64}) {
      for (int context : {4096, 16384, 32768}) shapes.push_back({batch, context});
    }
  }
  for (const auto& [batch, context] : shapes) {
    const int blocks_per_seq = context / kBlock;
    const size_t num_blocks = static_cast<size_t>(batch) * blocks_per_seq;
    const size_t pool_elems = num_blocks * kBlock * kKvHeads * kHd;
    if (pool_elems * 2 * 2 > (size_t{60} << 30)) continue;
    void *k, *v;
    CHECK_CUDA(cudaMalloc(&k, pool_elems * 2));
    CHECK_CUDA(cudaMalloc(&v, pool_elems * 2));
    FillRandomBf16(k, pool_elems, rng);
    FillRandomBf16(v, pool_elems, rng);
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
    std::vector<float> q(static_cast<size_t>(batch) * kHeads * kHd);
    std::normal_distribution<float> dist;
    for (float& x : q) x = dist(rng);
    cuda::DecodeAttentionParams p;
    p.q = Upload(q);
    p.kv.k_pool = k;
    p.kv.v_pool = v;
    p.kv.block_ids = Upload(ids);
    p.kv.block_tokens = Upload(tokens);
    p.kv.block_starts = Upload(starts);
    p.kv.table_offsets = Upload(offsets);
    p.positions = Upload(positions);
    p.kv.inv_freq = inv_freq;
    p.num_seqs = batch;
    p.n_heads = kHeads;
    p.kv.n_kv_heads = kKvHeads;
    p.kv.head_dim = kHd;
    p.kv.block_size = kBlock;
    p.kv.rope_style = cuda::KernelRopeStyle(rope.style);
    p.max_entries_per_seq = blocks_per_seq;
    // Workspace for the most splits any configuration (or the split sweep) picks.
    const std::vector<int> forced_splits = {8, 16, 24, 48, 64};
    int max_splits = 64;
    for (int c = 0; c < cuda::detail::NumDecodeConfigs(); ++c) {
      max_splits = std::max(max_splits, cuda::detail::ChooseDecodeSplitsFor(p, cuda::detail::DecodeConfigAt(c)));
    }
    const int splits = cuda::ChooseDecodeSplits(p);
    CHECK_CUDA(cudaMalloc(&p.workspace, cuda::DecodeWorkspaceBytes(p, max_splits)));
    CHECK_CUDA(cudaMalloc(&p.out, q.size() * sizeof(float)));
    int32_t* d_lazy = Upload(lazy_deltas);
    int32_t* d_zero = Upload(zero_deltas);
    const double kv_bytes = 2.0 * pool_elems * 2;
    if (profiling) {
      p.kv.block_deltas = d_lazy;
      for (int i = 0; i < 2; ++i) CHECK_CUDA(cuda::LaunchLazyDecodeAttention(p, nullptr));
      p.kv.block_deltas = d_zero;
      for (int i = 0; i < 2; ++i) CHECK_CUDA(cuda::LaunchLazyDecodeAttention(p, nullptr));
      CHECK_CUDA(cudaDeviceSynchronize());
      std::printf("profiled batch %d context %d, splits %d\n", batch, context, splits);
    } else {
      p.kv.block_deltas = d_lazy;
      CHECK_CUDA(cuda::LaunchLazyDecodeAttention(p, nullptr));
      const float lazy_ms = MedianMs([&] { cuda::LaunchLazyDecodeAttention(p, nullptr); });
      const float graph_ms = GraphMedianMs([&](cudaStream_t s) { cuda::LaunchLazyDecodeAttention(p, s); });
      cuda::DecodeAttentionParams merged = p;
      const size_t slots = static_cast<size_t>(batch) * kKvHeads;
      CHECK_CUDA(cudaMalloc(&merged.split_counters, slots * sizeof(int32_t)));
      CHECK_CUDA(cudaMemset(merged.split_counters, 0, slots * sizeof(int32_t)));
      CHECK_CUDA(cuda::LaunchLazyDecodeAttention(merged, nullptr));
      const float merged_ms = MedianMs([&] { cuda::LaunchLazyDecodeAttention(merged, nullptr); });
      const float merged_graph_ms = GraphMedianMs([&](cudaStream_t s) { cuda::LaunchLazyDecodeAttention(merged, s); });
      CHECK_CUDA(cudaFree(merged.split_counters));
      p.kv.block_deltas = d_zero;
      const float plain_ms = MedianMs([&] { cuda::LaunchLazyDecodeAttention(p, nullptr); });
      CHECK_CUDA(cudaGetLastError());
      const double gbs = kv_bytes / lazy_ms / 1e6;
      std::printf("%5d %7d %7d %10.1f %10.1f %9.0f %11.0f%% %11.1f%% %9.1f %10.1f %16.1f\n", batch, context, splits,
                  lazy_ms * 1e3, plain_ms * 1e3, gbs, 100.0 * gbs / copy_gbs, 100.0 * (lazy_ms / plain_ms - 1.0),
                  graph_ms * 1e3, merged_ms * 1e3, merged_graph_ms * 1e3);
      std::fflush(stdout);
      if (sweep) {
        for (int c = 0; c < cuda::detail::NumDecodeConfigs(); ++c) {
          const cuda::detail::DecodeKernelConfig config = cuda::detail::DecodeConfigAt(c);
          p.kv.block_deltas = d_lazy;
          CHECK_CUDA(cuda::detail::LaunchLazyDecodeAttentionWith(p, config, nullptr));
          const float ms = MedianMs([&] { cuda::detail::LaunchLazyDecodeAttentionWith(p, config, nullptr); });
          p.kv.block_deltas = d_zero;
          const float plain = MedianMs([&] { cuda::detail::LaunchLazyDecodeAttentionWith(p, config, nullptr); });
          CHECK_CUDA(cudaGetLastError());
          char line[200];
          std::snprintf(line, sizeof(line), "sweep %2dw x %ds %5d %7d %7d %10.1f %10.1f %9.0f %11.0f%% %11.1f%%",
                        config.warps, config.stages, batch, context, cuda::detail::ChooseDecodeSplitsFor(p, config),
                        ms * 1e3, plain * 1e3, kv_bytes / ms / 1e6, 100.0 * kv_bytes / ms / 1e6 / copy_gbs,
                        100.0 * (ms / plain - 1.0));
          sweep_rows.push_back(line);
        }
        if (batch == 1) {  // the default configuration at other split counts
          p.kv.block_deltas = d_lazy;
          for (int forced : forced_splits) {
            p.num_splits = forced;
            const float ms = MedianMs([&] { cuda::LaunchLazyDecodeAttention(p, nullptr); });
            const float graph = GraphMedianMs([&](cudaStream_t s) { cuda::LaunchLazyDecodeAttention(p, s); });
            CHECK_CUDA(cudaGetLastError());
            char line[200];
            std::snprintf(line, sizeof(line), "splits %3d     %5d %7d %7d %10.1f %10s %9.0f %11.0f%% %12s graph %.1f",
                          forced, batch, context, forced, ms * 1e3, "-", kv_bytes / ms / 1e6,
                          100.0 * kv_bytes / ms / 1e6 / copy_gbs, "-", graph * 1e3);
            sweep_rows.push_back(line);
          }
          p.num_splits = 0;
        }
      }
    }
    for (const void* ptr :
         {(const void*)p.q, (const void*)p.kv.block_ids, (const void*)p.kv.block_tokens, (const void*)p.kv.block_starts,
          (const void*)p.kv.table_offsets, (const void*)p.positions, (const void*)p.workspace, (const void*)p.out,
          (const void*)d_lazy, (const void*)d_zero, (const void*)k, (const void*)v}) {
      cudaFree(const_cast<void*>(ptr));
    }
  }
  if (!sweep_rows.empty()) {
    std::printf("launch configurations (warps per CTA x pipeline stages per warp; first = default)\n");
    std::printf("%-15s %5s %7s %7s %10s %10s %9s %12s %12s\n", "config", "batch", "context", "splits", "lazy_us",
                "no_rot_us", "lazy_GB/s", "vs_copy", "rotation_cost");
    for (const auto& line : sweep_rows) std::printf("%s\n", line.c_str());
  }
  return 0;
}
