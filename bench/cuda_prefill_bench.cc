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
// A third table, questions: a batch of sequences of 8 cached documents of 512 tokens and a
// 16-token question, the question's tokens the queries (what a request whose documents are
// all cached prefills), with the heads of a KV group packed into a tile (the default) and
// not, against reading the batch's keys and values once at the HBM rate of a device copy.
// usage: cuda_prefill_bench [L [full|last] | questions]   (prints the tables; run on a GPU machine;
// the arguments keep only that length and scenario, or the questions table, for a profiler)
#include <cuda_bf16.h>
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
#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/rope_style.h"

namespace {

using lazykv::bench::AlternatedMedianMs;
using lazykv::bench::MedianMs;
using lazykv::bench::Upload;

}  // namespace

namespace lazykv {
namespace {

// Sequences of `docs` documents of kDoc tokens at random deltas and then `own` tokens of the
// request (delta 0), in blocks of kBlock: the pools (random) and the block table, on the device.
struct PagedBatch {
  void *k = nullptr, *v = nullptr;
  int32_t *ids = nullptr, *tokens = nullptr, *starts = nullptr, *offsets = nullptr, *deltas = nullptr;
  int32_t* zero_deltas = nullptr;  // every delta 0: the same attention with one rotation per tile
  size_t pool_bytes = 0;           // of K, and of V
};

PagedBatch MakePagedBatch(int batch, int docs, int doc_tokens, int own, int block, int kv_heads, int hd,
                          std::mt19937& rng) {
  PagedBatch b;
  std::vector<int32_t> ids, tokens, starts, deltas, offsets = {0};
  int next_block = 0;
  for (int s = 0; s < batch; ++s) {
    int pos = 0;
    const auto add = [&](int n, int32_t delta) {
      for (int done = 0; done < n; done += block) {
        ids.push_back(next_block++);
        tokens.push_back(std::min(block, n - done));
        starts.push_back(pos + done);
        deltas.push_back(delta);
      }
      pos += n;
    };
    for (int d = 0; d < docs; ++d) add(doc_tokens, 1 + static_cast<int32_t>(rng() % 100000));
    add(own, 0);
    offsets.push_back(static_cast<int32_t>(ids.size()));
  }
  const size_t elems = static_cast<size_t>(next_block) * block * kv_heads * hd;
  b.pool_bytes = elems * 2;
  CHECK_CUDA(cudaMalloc(&b.k, b.pool_bytes));
  CHECK_CUDA(cudaMalloc(&b.v, b.pool_bytes));
  CHECK_CUDA(bench::FillRandomBf16(b.k, elems, 5 + batch));
  CHECK_CUDA(bench::FillRandomBf16(b.v, elems, 6 + batch));
  b.ids = Upload(ids);
  b.tokens = Upload(tokens);
  b.starts = Upload(starts);
  b.offsets = Upload(offsets);
  b.deltas = Upload(deltas);
  b.zero_deltas = Upload(std::vector<int32_t>(deltas.size(), 0));
  return b;
}

void FreePagedBatch(PagedBatch& b) {
  for (void* ptr : {b.k, b.v, (void*)b.ids, (void*)b.tokens, (void*)b.starts, (void*)b.offsets, (void*)b.deltas,
                    (void*)b.zero_deltas}) {
    CHECK_CUDA(cudaFree(ptr));
  }
}

// Llama-3-8B's attention shape (rotate-half RoPE) over batch b: every sequence's last n_q
// tokens of `len` are the queries, raw q random; q, out and the query tables allocated here
// (FreeQueries), no workspace.
cuda::PrefillAttentionParams QueryParams(const PagedBatch& b, int batch, int len, int n_q, const double* inv_freq,
                                         int heads, int kv_heads, int hd, int block, uint64_t seed) {
  std::vector<int32_t> q_offsets = {0}, q_pos0;
  for (int s = 0; s < batch; ++s) {
    q_offsets.push_back(q_offsets.back() + n_q);
    q_pos0.push_back(len - n_q);
  }
  const size_t q_elems = static_cast<size_t>(batch) * n_q * heads * hd;
  float *q, *out;
  CHECK_CUDA(cudaMalloc(&q, q_elems * 4));
  CHECK_CUDA(cudaMalloc(&out, q_elems * 4));
  CHECK_CUDA(bench::FillRandomF32(q, q_elems, seed));
  cuda::PrefillAttentionParams p;
  p.q = q;
  p.out = out;
  p.kv.k_pool = b.k;
  p.kv.v_pool = b.v;
  p.kv.block_ids = b.ids;
  p.kv.block_tokens = b.tokens;
  p.kv.block_starts = b.starts;
  p.kv.table_offsets = b.offsets;
  p.kv.block_deltas = b.deltas;
  p.kv.inv_freq = inv_freq;
  p.kv.n_kv_heads = kv_heads;
  p.kv.head_dim = hd;
  p.kv.block_size = block;
  p.kv.rope_style = cuda::RopeStyle::kRotateHalf;
  p.query_offsets = Upload(q_offsets);
  p.query_pos0 = Upload(q_pos0);
  p.num_seqs = batch;
  p.n_heads = heads;
  p.max_queries_per_seq = n_q;
  p.max_keys = len;  // every query sees at most the sequence (the launcher's hint)
  p.total_queries = batch * n_q;
  return p;
}

void FreeQueries(cuda::PrefillAttentionParams& p) {
  for (const void* ptr : {(const void*)p.q, (const void*)p.out, (const void*)p.workspace, (const void*)p.query_offsets,
                          (const void*)p.query_pos0}) {
    if (ptr != nullptr) CHECK_CUDA(cudaFree(const_cast<void*>(ptr)));
  }
}

// The questions table (see the top of the file).
void QuestionBench(const double* inv_freq, int heads, int kv_heads, int hd, int block, std::mt19937& rng) {
  constexpr int kDocs = 8, kDocTokens = 512, kQuestion = 16;
  std::printf("\nquestions: %d cached documents of %d tokens, %d question tokens per sequence\n", kDocs, kDocTokens,
              kQuestion);
  std::printf("%5s %6s %6s %6s %11s %13s %8s %9s %10s %9s\n", "batch", "pack", "splits", "kv_GB", "packed_ms",
              "unpacked_ms", "speedup", "floor_ms", "of_floor", "HBM_GB/s");
  for (int batch : {1, 8, 32, 64}) {
    PagedBatch b = MakePagedBatch(batch, kDocs, kDocTokens, kQuestion, block, kv_heads, hd, rng);
    // The HBM rate of this run: a device copy of one pool (reads and writes it).
    void* scratch = nullptr;
    CHECK_CUDA(cudaMalloc(&scratch, b.pool_bytes));
    const float copy_ms =
        MedianMs([&] { CHECK_CUDA(cudaMemcpyAsync(scratch, b.k, b.pool_bytes, cudaMemcpyDeviceToDevice)); });
    CHECK_CUDA(cudaFree(scratch));
    const double hbm_gbs = 2.0 * b.pool_bytes / 1e9 / (copy_ms / 1e3);
    const double kv_gb = 2.0 * b.pool_bytes / 1e9;  // what the attention must read once
    cuda::PrefillAttentionParams p = QueryParams(b, batch, kDocs * kDocTokens + kQuestion, kQuestion, inv_freq, heads,
                                                 kv_heads, hd, block, 77 + batch);
    // A workspace for the larger of the two launches' splits.
    cuda::PrefillAttentionParams unpacked = p;
    unpacked.pack_heads = 1;
    const int pack = cuda::ChoosePrefillPack(p), splits = cuda::ChoosePrefillSplits(p);
    const size_t ws = std::max(cuda::PrefillWorkspaceBytes(p, splits),
                               cuda::PrefillWorkspaceBytes(unpacked, cuda::ChoosePrefillSplits(unpacked)));
    if (ws > 0) CHECK_CUDA(cudaMalloc(&p.workspace, ws));
    unpacked.workspace = p.workspace;
    const auto [packed_ms, unpacked_ms] =
        AlternatedMedianMs([&] { cuda::LaunchLazyPrefillAttention(p, nullptr); },
                           [&] { cuda::LaunchLazyPrefillAttention(unpacked, nullptr); });
    CHECK_CUDA(cudaGetLastError());
    const double floor_ms = kv_gb / hbm_gbs * 1e3;
    std::printf("%5d %6d %6d %6.3f %11.4f %13.4f %7.2fx %9.4f %9.2fx %9.0f\n", batch, pack, splits, kv_gb, packed_ms,
                unpacked_ms, unpacked_ms / packed_ms, floor_ms, packed_ms / floor_ms, hbm_gbs);
    {  // the packed launch on q rotated at its positions before it (the backend's) against raw q
      cuda::PrefillAttentionParams rotated = p;
      rotated.q_rotated = true;
      const auto [rotated_ms, raw_ms] = AlternatedMedianMs([&] { cuda::LaunchLazyPrefillAttention(rotated, nullptr); },
                                                           [&] { cuda::LaunchLazyPrefillAttention(p, nullptr); });
      CHECK_CUDA(cudaGetLastError());
      std::printf("      packed, q rotated before it (the backend's launch): %.4f ms; raw q: %.4f ms (%.3fx)\n",
                  rotated_ms, raw_ms, raw_ms / rotated_ms);
    }
    if (batch <= 8) {  // the split count at small batches (latency-bound): the chosen one against others
      // (up to kMaxSplits; 32 and 64, with the cap raised for a run, were 1.5x and 2.6x slower at batch 1)
      std::printf("      packed, splits forced:");
      for (int forced : {2, 4, 8, 16}) {
        cuda::PrefillAttentionParams f = p;
        f.num_splits = forced;
        const int used = cuda::ChoosePrefillSplits(f);
        void* ws_forced = nullptr;
        const size_t bytes = cuda::PrefillWorkspaceBytes(f, used);
        if (bytes > 0) CHECK_CUDA(cudaMalloc(&ws_forced, bytes));
        f.workspace = static_cast<float*>(ws_forced);
        const float ms = MedianMs([&] { cuda::LaunchLazyPrefillAttention(f, nullptr); });
        CHECK_CUDA(cudaGetLastError());
        std::printf(" %d: %.4f ms", used, ms);
        if (ws_forced != nullptr) CHECK_CUDA(cudaFree(ws_forced));
      }
      std::printf("\n");
    }
    FreeQueries(p);
    FreePagedBatch(b);
  }
}

// With LAZYKV_PREFILL_TIMELINE_OUT=PREFIX in a diagnostic build (CMake
// -DLAZYKV_PREFILL_TIMELINE=ON): the one-tile kernel's in-kernel timeline of its first four
// waves of CTAs for each shape, written to PREFIX_L_scenario as int32 (ctas, tiles, events)
// then int64 stamps [ctas][tiles][events]; bench/prefill_timeline.py reads it. With
// LAZYKV_PREFILL_TIMELINE_SCHEDULE=3, the persistent kernel's instead: its CTAs (one an SM),
// each CTA's tiles numbered across its work tiles (works: the launch's work tiles), launched
// with its work starts where the launch can have them.
void DumpTimeline(const cuda::PrefillAttentionParams& p, int sms, int works, const std::string& path) {
  const char* schedule_env = std::getenv("LAZYKV_PREFILL_TIMELINE_SCHEDULE");
  const bool persistent = schedule_env != nullptr && std::string(schedule_env) == "3";
  const int tiles_per_work = static_cast<int>((p.max_keys > 0 ? p.max_keys : 16384) / 128 + 2);
  const int ctas = persistent ? sms : 4 * sms;
  const int tiles = persistent ? (works + sms - 1) / sms * tiles_per_work : tiles_per_work;
  constexpr int kEvents = cuda::detail::kPrefillTimelineEvents;
  const size_t count = static_cast<size_t>(ctas) * tiles * kEvents;
  long long* stamps = nullptr;
  CHECK_CUDA(cudaMalloc(&stamps, count * sizeof(long long)));
  CHECK_CUDA(cudaMemset(stamps, 0, count * sizeof(long long)));
  if (cuda::detail::SetPrefillTimeline(stamps, ctas, tiles) != cudaSuccess) {
    cudaGetLastError();
    std::printf("(no timeline: not a -DLAZYKV_PREFILL_TIMELINE=ON build)\n");
    CHECK_CUDA(cudaFree(stamps));
    return;
  }
  // The persistent kernel as the backend launches it: with its work starts made before it.
  cuda::PrefillAttentionParams launch = p;
  void* starts = nullptr;
  if (const size_t bytes = cuda::PrefillWorkStartsBytes(p); persistent && bytes > 0) {
    CHECK_CUDA(cudaMalloc(&starts, bytes));
    launch.work_starts = starts;
  }
  const char* rotated = std::getenv("LAZYKV_PREFILL_TIMELINE_Q_ROTATED");  // =1: the backend's q
  launch.q_rotated = rotated != nullptr && std::string(rotated) == "1";
  const char* bf16_out = std::getenv("LAZYKV_PREFILL_TIMELINE_OUT_BF16");  // =1: the backend's output
  void* out_bf16 = nullptr;
  if (bf16_out != nullptr && std::string(bf16_out) == "1") {
    CHECK_CUDA(cudaMalloc(&out_bf16, static_cast<size_t>(p.total_queries) * p.n_heads * p.kv.head_dim * 2));
    launch.out_bf16 = out_bf16;
  }
  CHECK_CUDA(cuda::detail::LaunchLazyPrefillAttentionVariant(
      launch, persistent ? cuda::detail::kPersistentSchedule : cuda::detail::kSpecializedSchedule, nullptr));
  CHECK_CUDA(cudaDeviceSynchronize());
  if (starts != nullptr) CHECK_CUDA(cudaFree(starts));
  if (out_bf16 != nullptr) CHECK_CUDA(cudaFree(out_bf16));
  CHECK_CUDA(cuda::detail::SetPrefillTimeline(nullptr, 0, 0));
  std::vector<long long> host(count);
  CHECK_CUDA(cudaMemcpy(host.data(), stamps, count * sizeof(long long), cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaFree(stamps));
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    std::printf("(cannot write %s)\n", path.c_str());
    return;
  }
  const int32_t header[3] = {ctas, tiles, kEvents};
  std::fwrite(header, sizeof(header), 1, f);
  std::fwrite(host.data(), sizeof(long long), count, f);
  std::fclose(f);
  std::printf("(timeline: %s)\n", path.c_str());
}

}  // namespace
}  // namespace lazykv

int main(int argc, char** argv) {
  // "questions": that table alone (for a profiler: its first kernels are batch 1's).
  const bool only_questions = argc > 1 && std::string(argv[1]) == "questions";
  const int only_len = argc > 1 && !only_questions ? std::atoi(argv[1]) : 0;
  const std::string only_scenario = argc > 2 ? argv[2] : "";
  using namespace lazykv;
  constexpr int kHeads = 32, kKvHeads = 8, kHd = 128, kBlock = 16, kDoc = 512, kTokens = 16384;
  int sms = 0;
  CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs\n", prop.name, sms);
  if (const char* probe = cuda::detail::PrefillProbeName(); probe != nullptr) {
    std::printf("PROBE BUILD (%s): outputs are wrong; read the one-tile kernel's lines (schedule 2)\n", probe);
  }

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
  for (int len : {1024, 2048, 4096, 16384}) {
    if (only_questions || (only_len != 0 && len != only_len)) continue;
    const int batch = kTokens / len;
    // len / kDoc - 1 documents at random deltas, then 512 of the request's own tokens.
    PagedBatch b = MakePagedBatch(batch, len / kDoc - 1, kDoc, kDoc, kBlock, kKvHeads, kHd, rng);
    for (int scenario = 0; scenario < 2; ++scenario) {
      if (!only_scenario.empty() && only_scenario != (scenario == 0 ? "full" : "last")) continue;
      const int n_q = scenario == 0 ? len : kDoc;
      const int pos0 = len - n_q;
      cuda::PrefillAttentionParams p =
          QueryParams(b, batch, len, n_q, inv_freq, kHeads, kKvHeads, kHd, kBlock, 33 + len + scenario);
      const int splits = cuda::ChoosePrefillSplits(p);
      if (splits > 1) CHECK_CUDA(cudaMalloc(&p.workspace, cuda::PrefillWorkspaceBytes(p, splits)));
      CHECK_CUDA(cuda::LaunchLazyPrefillAttention(p, nullptr));
      CHECK_CUDA(cudaDeviceSynchronize());
      if (const char* timeline = std::getenv("LAZYKV_PREFILL_TIMELINE_OUT"); timeline != nullptr) {
        const int works = batch * kHeads * ((n_q + 127) / 128);  // unpacked, unsplit: the bench's rows
        DumpTimeline(p, sms, works,
                     std::string(timeline) + "_" + std::to_string(len) + "_" + (scenario == 0 ? "full" : "last"));
      }
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
          AlternatedMedianMs([&] { launch_with(b.deltas, -1); }, [&] { launch_with(b.zero_deltas, -1); });
      float schedule_ms[cuda::detail::kNumPrefillSchedules], schedule_norot_ms[cuda::detail::kNumPrefillSchedules];
      for (int sc = 0; sc < cuda::detail::kNumPrefillSchedules; ++sc) {
        std::tie(schedule_ms[sc], schedule_norot_ms[sc]) =
            AlternatedMedianMs([&] { launch_with(b.deltas, sc); }, [&] { launch_with(b.zero_deltas, sc); });
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
      // The default launch on q rotated at its positions before it (PrefillAttentionParams::q_rotated,
      // as the backend's KV write leaves it) against raw q, alternated.
      {
        const auto [rotated_ms, raw_ms] = AlternatedMedianMs(
            [&] {
              p.q_rotated = true;
              launch_with(b.deltas, -1);
            },
            [&] {
              p.q_rotated = false;
              launch_with(b.deltas, -1);
            });
        p.q_rotated = false;
        CHECK_CUDA(cudaGetLastError());
        std::printf(
            "  (q rotated before the kernel (the backend's launch): %.3f ms, %.1f TFLOP/s; raw q: %.3f ms, "
            "%.1f TFLOP/s: %.3fx)\n",
            rotated_ms, flops / rotated_ms / 1e9, raw_ms, flops / raw_ms / 1e9, raw_ms / rotated_ms);
      }
      // The persistent kernel with its work starts made before it (PrefillAttentionParams::work_starts)
      // against its own walk at each work tile boundary, alternated; then with q rotated before it.
      if (const size_t bytes = cuda::PrefillWorkStartsBytes(p); bytes > 0 && splits == 1) {
        void* starts = nullptr;
        CHECK_CUDA(cudaMalloc(&starts, bytes));
        const auto [with_ms, without_ms] = AlternatedMedianMs(
            [&] {
              p.work_starts = starts;
              launch_with(b.deltas, cuda::detail::kPersistentSchedule);
            },
            [&] {
              p.work_starts = nullptr;
              launch_with(b.deltas, cuda::detail::kPersistentSchedule);
            });
        p.work_starts = nullptr;
        CHECK_CUDA(cudaGetLastError());
        CHECK_CUDA(cudaFree(starts));
        std::printf(
            "  (schedule 3 with work starts: lazy %.3f ms, %.1f TFLOP/s; walking: %.3f ms, %.1f TFLOP/s: %.3fx)\n",
            with_ms, flops / with_ms / 1e9, without_ms, flops / without_ms / 1e9, without_ms / with_ms);
        CHECK_CUDA(cudaMalloc(&starts, bytes));
        const auto [rotated_ms, raw_ms] = AlternatedMedianMs(
            [&] {
              p.work_starts = starts;
              p.q_rotated = true;
              launch_with(b.deltas, cuda::detail::kPersistentSchedule);
            },
            [&] {
              p.work_starts = starts;
              p.q_rotated = false;
              launch_with(b.deltas, cuda::detail::kPersistentSchedule);
            });
        p.work_starts = nullptr;
        p.q_rotated = false;
        CHECK_CUDA(cudaGetLastError());
        CHECK_CUDA(cudaFree(starts));
        std::printf(
            "  (schedule 3 with work starts, q rotated before: lazy %.3f ms, %.1f TFLOP/s; raw q: %.3f ms, "
            "%.1f TFLOP/s: %.3fx)\n",
            rotated_ms, flops / rotated_ms / 1e9, raw_ms, flops / raw_ms / 1e9, raw_ms / rotated_ms);
      }
      // The backend's launch (work starts; q rotated where it gains) with its output wanted in
      // bf16 for the output GEMM (out_bf16: the unsplit persistent kernel writes only that; other
      // launches convert after them) against the fp32 output and LaunchToBf16 after it, as the
      // backend ran them before, alternated.
      if (const size_t bytes = cuda::PrefillWorkStartsBytes(p); bytes > 0) {
        void* starts = nullptr;
        __nv_bfloat16* out_bf16 = nullptr;
        const size_t n = static_cast<size_t>(p.total_queries) * kHeads * kHd;
        CHECK_CUDA(cudaMalloc(&starts, bytes));
        CHECK_CUDA(cudaMalloc(&out_bf16, n * sizeof(__nv_bfloat16)));
        p.work_starts = starts;
        p.out_bf16 = out_bf16;
        p.q_rotated = cuda::PrefillTakesPersistentKernel(p);
        const auto [bf16_ms, fp32_ms] = AlternatedMedianMs(
            [&] {
              p.out_bf16 = out_bf16;
              launch_with(b.deltas, -1);
            },
            [&] {
              p.out_bf16 = nullptr;
              launch_with(b.deltas, -1);
              CHECK_CUDA(cuda::LaunchToBf16(p.out, n, out_bf16, nullptr));
            });
        // The persistent kernel (q rotated, bf16 output: no conversion after it) against that launch,
        // where the default takes the one-tile kernel (kPersistentMaxKeys): the bound of its choice.
        float persistent_ms = 0, default_ms = 0;
        p.out_bf16 = out_bf16;
        if (splits == 1 && cuda::detail::ChoosePrefillSchedule(p, sms) != cuda::detail::kPersistentSchedule) {
          const bool rotate_for_default = p.q_rotated;
          std::tie(persistent_ms, default_ms) = AlternatedMedianMs(
              [&] {
                p.out_bf16 = out_bf16;
                p.q_rotated = true;
                launch_with(b.deltas, cuda::detail::kPersistentSchedule);
              },
              [&] {
                p.out_bf16 = out_bf16;
                p.q_rotated = rotate_for_default;
                launch_with(b.deltas, -1);
              });
        }
        p.out_bf16 = nullptr;
        p.work_starts = nullptr;
        p.q_rotated = false;
        CHECK_CUDA(cudaGetLastError());
        CHECK_CUDA(cudaFree(starts));
        CHECK_CUDA(cudaFree(out_bf16));
        std::printf(
            "  (the backend's launch, output in bf16: %.3f ms, %.1f TFLOP/s; fp32 output, then LaunchToBf16: %.3f ms, "
            "%.1f TFLOP/s: %.3fx)\n",
            bf16_ms, flops / bf16_ms / 1e9, fp32_ms, flops / fp32_ms / 1e9, fp32_ms / bf16_ms);
        if (persistent_ms > 0) {
          std::printf(
              "  (output in bf16: persistent kernel, q rotated: %.3f ms, %.1f TFLOP/s; the default launch (one-tile "
              "kernel, conversion): %.3f ms, "
              "%.1f TFLOP/s: %.3fx)\n",
              persistent_ms, flops / persistent_ms / 1e9, default_ms, flops / default_ms / 1e9,
              default_ms / persistent_ms);
        }
      }
      FreeQueries(p);
    }
    FreePagedBatch(b);
  }
  if (only_len == 0) lazykv::QuestionBench(inv_freq, kHeads, kKvHeads, kHd, kBlock, rng);
  return 0;
}
