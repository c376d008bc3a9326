// Lazy paged prefill attention on the GPU against baselines measured in the same run:
// a tensor-core ceiling (a pure mma.sync m16n8k16 bf16 loop; the kernel itself issues
// wgmma, whose ceiling is higher: the cuBLAS GEMM's below) and the same kernel with every delta 0 (rotation off: one
// query rotation per CTA instead of one per document). PyTorch SDPA on the same shapes is measured by
// bench/sdpa_prefill_reference.py (which also measures the cuBLAS GEMM ceiling).
//
// Shape: Llama-3-8B attention (32 query heads, 8 KV heads, head dim 128), bf16 KV in
// blocks of 16. A sequence of L tokens is (L/512 - 1) documents of 512 tokens, each at its
// own random delta, then 512 of the request's own tokens (delta 0). Batch = 16384 / L
// sequences, so every row of the table holds 16k tokens. Two scenarios:
//   full: every token is a query (pos0 = 0): causal attention over the whole sequence,
//         each query seeing the documents before it (SDPA: is_causal on L x L).
//   last: the 512 own tokens are the queries (pos0 = L - 512): they see every document
//         and are causal among themselves (SDPA: lower-right causal, 512 x L).
// FLOPs count the visible (query, key) pairs exactly: 4 * head_dim * heads per pair.
// usage: cuda_prefill_bench [L [full|last]]   (prints a table; run on a GPU machine; the
// arguments keep only that length and scenario, for a profiler)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "bench/cuda_bench_util.h"
#include "bench/prefill_bench_device.h"
#include "common/model_config.h"
#include "kernels/cuda/lazy_prefill_attention.h"
#include "kernels/cuda/rope_style.h"

namespace {

using lazykv::bench::AlternatedMedianMs;
using lazykv::bench::MedianMs;
using lazykv::bench::Upload;

}  // namespace

int main(int argc, char** argv) {
  const int only_len = argc > 1 ? std::atoi(argv[1]) : 0;
  const std::string only_scenario = argc > 2 ? argv[2] : "";
  using namespace lazykv;
  constexpr int kHeads = 32, kKvHeads = 8, kHd = 128, kBlock = 16, kDoc = 512, kTokens = 16384;
  int sms = 0;
  CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs\n", prop.name, sms);

  // The mma.sync bf16 ceiling, every SM busy (a lower bound on wgmma's).
  {
    double gflop = 0;
    const float ms = MedianMs([&] { CHECK_CUDA(bench::MmaPeak(sms, &gflop)); }, 10);
    std::printf("mma.sync m16n8k16 bf16 peak: %.0f TFLOP/s (%.3f ms)\n", gflop / ms, ms);
  }

  RopeConfig rope;
  rope.style = RopeStyle::kRotateHalf;
  rope.theta = 500000;
  rope.llama3_scaling = true;
  double* inv_freq = Upload(RopeInverseFrequencies(rope, kHd));

  std::printf("%-8s %6s %5s %9s %6s %10s %10s %12s %12s %9s\n", "scenario", "L", "batch", "queries", "splits",
              "lazy_ms", "no_rot_ms", "lazy_TFLOP/s", "norot_TFLOP/s", "rot_cost");
  std::mt19937 rng(1);
  for (int len : {1024, 4096, 16384}) {
    if (only_len != 0 && len != only_len) continue;
    const int batch = kTokens / len;
    const int blocks_per_seq = len / kBlock;
    const size_t num_blocks = size_t(batch) * blocks_per_seq;
    const size_t pool_elems = num_blocks * kBlock * kKvHeads * kHd;
    void *k, *v;
    CHECK_CUDA(cudaMalloc(&k, pool_elems * 2));
    CHECK_CUDA(cudaMalloc(&v, pool_elems * 2));
    CHECK_CUDA(bench::FillRandomBf16(k, pool_elems, 11 + len));
    CHECK_CUDA(bench::FillRandomBf16(v, pool_elems, 22 + len));
    std::vector<int32_t> ids, tokens, lazy_deltas, zero_deltas, starts, offsets = {0};
    for (int s = 0; s < batch; ++s) {
      for (int b = 0; b < blocks_per_seq; ++b) {
        ids.push_back(s * blocks_per_seq + b);
        tokens.push_back(kBlock);
        starts.push_back(b * kBlock);
        zero_deltas.push_back(0);
      }
      // One random delta per document; the last 512 tokens are the request's own.
      const int docs = len / kDoc - 1;
      for (int d = 0; d < docs; ++d) {
        const int32_t delta = 1 + static_cast<int32_t>(rng() % 100000);
        for (int b = 0; b < kDoc / kBlock; ++b) lazy_deltas.push_back(delta);
      }
      for (int b = 0; b < kDoc / kBlock; ++b) lazy_deltas.push_back(0);
      offsets.push_back(static_cast<int32_t>(ids.size()));
    }
    int32_t* d_ids = Upload(ids);
    int32_t* d_tokens = Upload(tokens);
    int32_t* d_starts = Upload(starts);
    int32_t* d_offsets = Upload(offsets);
    int32_t* d_lazy = Upload(lazy_deltas);
    int32_t* d_zero = Upload(zero_deltas);

    for (int scenario = 0; scenario < 2; ++scenario) {
      if (!only_scenario.empty() && only_scenario != (scenario == 0 ? "full" : "last")) continue;
      const int n_q = scenario == 0 ? len : kDoc;
      const int pos0 = len - n_q;
      std::vector<int32_t> q_offsets = {0}, q_pos0;
      for (int s = 0; s < batch; ++s) {
        q_offsets.push_back(q_offsets.back() + n_q);
        q_pos0.push_back(pos0);
      }
      const size_t q_elems = size_t(batch) * n_q * kHeads * kHd;
      float *q, *out;
      CHECK_CUDA(cudaMalloc(&q, q_elems * 4));
      CHECK_CUDA(cudaMalloc(&out, q_elems * 4));
      CHECK_CUDA(bench::FillRandomF32(q, q_elems, 33 + len + scenario));
      cuda::PrefillAttentionParams p;
      p.q = q;
      p.kv.k_pool = k;
      p.kv.v_pool = v;
      p.kv.block_ids = d_ids;
      p.kv.block_tokens = d_tokens;
      p.kv.block_starts = d_starts;
      p.kv.table_offsets = d_offsets;
      p.query_offsets = Upload(q_offsets);
      p.query_pos0 = Upload(q_pos0);
      p.kv.inv_freq = inv_freq;
      p.out = out;
      p.num_seqs = batch;
      p.n_heads = kHeads;
      p.kv.n_kv_heads = kKvHeads;
      p.kv.head_dim = kHd;
      p.kv.block_size = kBlock;
      p.kv.rope_style = cuda::KernelRopeStyle(rope.style);
      p.max_queries_per_seq = n_q;
      const int splits = cuda::ChoosePrefillSplits(p);
      if (splits > 1) CHECK_CUDA(cudaMalloc(&p.workspace, cuda::PrefillWorkspaceBytes(p, splits)));
      p.kv.block_deltas = d_lazy;
      CHECK_CUDA(cuda::LaunchLazyPrefillAttention(p, nullptr));
      CHECK_CUDA(cudaDeviceSynchronize());
      // Each kernel with and without the rotation (all deltas 0), timed alternately.
      const auto launch_with = [&](const int32_t* deltas, int schedule) {
        p.kv.block_deltas = deltas;
        if (schedule < 0) {
          cuda::LaunchLazyPrefillAttention(p, nullptr);
        } else {
          cuda::detail::LaunchLazyPrefillAttentionVariant(p, schedule, nullptr);
        }
      };
      const auto [lazy_ms, plain_ms] =
          AlternatedMedianMs([&] { launch_with(d_lazy, -1); }, [&] { launch_with(d_zero, -1); });
      float schedule_ms[cuda::detail::kNumPrefillSchedules], schedule_norot_ms[cuda::detail::kNumPrefillSchedules];
      for (int sc = 0; sc < cuda::detail::kNumPrefillSchedules; ++sc) {
        std::tie(schedule_ms[sc], schedule_norot_ms[sc]) =
            AlternatedMedianMs([&] { launch_with(d_lazy, sc); }, [&] { launch_with(d_zero, sc); });
      }
      CHECK_CUDA(cudaGetLastError());
      // Visible pairs per sequence: query at position pos0 + i sees pos0 + i + 1 keys.
      const double pairs = double(n_q) * pos0 + double(n_q) * (n_q + 1) / 2.0;
      const double flops = 4.0 * kHd * kHeads * pairs * batch;
      std::printf("%-8s %6d %5d %9d %6d %10.3f %10.3f %12.1f %12.1f %8.1f%%\n", scenario == 0 ? "full" : "last", len,
                  batch, n_q, splits, lazy_ms, plain_ms, flops / lazy_ms / 1e9, flops / plain_ms / 1e9,
                  100.0 * (lazy_ms / plain_ms - 1.0));
      for (int sc = 0; sc < cuda::detail::kNumPrefillSchedules; ++sc) {
        std::printf("  (schedule %d: lazy %.3f ms, %.1f TFLOP/s; no rotation %.3f ms, %.1f TFLOP/s; rotation %.1f%%)\n",
                    sc, schedule_ms[sc], flops / schedule_ms[sc] / 1e9, schedule_norot_ms[sc],
                    flops / schedule_norot_ms[sc] / 1e9, 100.0 * (schedule_ms[sc] / schedule_norot_ms[sc] - 1.0));
      }
      CHECK_CUDA(cudaFree(q));
      CHECK_CUDA(cudaFree(out));
      if (p.workspace != nullptr) CHECK_CUDA(cudaFree(p.workspace));
      CHECK_CUDA(cudaFree(const_cast<int32_t*>(p.query_offsets)));
      CHECK_CUDA(cudaFree(const_cast<int32_t*>(p.query_pos0)));
    }
    for (void* ptr : {(void*)k, (void*)v, (void*)d_ids, (void*)d_tokens, (void*)d_starts, (void*)d_offsets,
                      (void*)d_lazy, (void*)d_zero}) {
      CHECK_CUDA(cudaFree(ptr));
    }
  }
  return 0;
}
