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
// Each row also prints the SM clock read right after its timed pairs (sm_clock.h): the GPU
// may run at its power cap, where the clock follows the kernels in the process.
// A third table, questions: a batch of sequences of 8 cached documents of 512 tokens and a
// 16-token question, the question's tokens the queries (what a request whose documents are
// all cached prefills), with the heads of a KV group packed into a tile (the default) and
// not, against reading the batch's keys and values once at the HBM rate of a device copy.
// A fourth, mixed: documents encoded in the same launch as questions over cached documents, the
// launches of a lazy step under load, on the one-tile and the persistent kernel.
// usage: cuda_prefill_bench [L [full|last] | questions | mixed]   (prints the tables; run on a GPU
// machine; the arguments keep only that length and scenario, or that table, for a profiler)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "bench/cuda_bench_util.h"
#include "bench/prefill_bench_device.h"
#include "bench/prefill_paged_batch.h"
#include "bench/sm_clock.h"
#include "common/model_config.h"
#include "kernels/cuda/lazy_prefill_attention.h"
#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/rope_style.h"

namespace {

using lazykv::bench::AlternatedMedianMs;
using lazykv::bench::FreePagedBatch;
using lazykv::bench::FreeQueries;
using lazykv::bench::MakePagedBatch;
using lazykv::bench::MedianMs;
using lazykv::bench::PagedBatch;
using lazykv::bench::QueryParams;
using lazykv::bench::SeqLayout;
using lazykv::bench::Upload;

// The SM clock now (sm_clock.h): under the GPU's power cap the figures just measured ran at
// about this clock, set by the kernels of the last seconds.
float SmClockMhz() {
  float mhz = 0.0f;
  CHECK_CUDA(lazykv::bench::MeasureSmClockMhz(nullptr, 200, &mhz));
  return mhz;
}

}  // namespace

namespace lazykv {
namespace {

void DumpTimeline(const cuda::PrefillAttentionParams& p, int sms, int works, const std::string& path);

// The questions table (see the top of the file).
void QuestionBench(const double* inv_freq, int heads, int kv_heads, int hd, int block, int sms, std::mt19937& rng) {
  constexpr int kDocs = 8, kDocTokens = 512, kQuestion = 16;
  std::printf("\nquestions: %d cached documents of %d tokens, %d question tokens per sequence\n", kDocs, kDocTokens,
              kQuestion);
  std::printf("%5s %6s %6s %6s %11s %13s %8s %9s %10s %9s\n", "batch", "pack", "splits", "kv_GB", "packed_ms",
              "unpacked_ms", "speedup", "floor_ms", "of_floor", "HBM_GB/s");
  // LAZYKV_PREFILL_TIMELINE_OUT: the packed launch's timelines at small batches (a split a CTA),
  // walking its table and on starts made before: where a CTA's fixed path goes.
  const char* timeline = std::getenv("LAZYKV_PREFILL_TIMELINE_OUT");
  for (int batch : {1, 8, 32, 64}) {
    const bool dump_timeline = timeline != nullptr && batch <= 8;
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
    {  // the backend's later layers: the packed launch on work starts an earlier launch made (read
       // before the kernel's wait), against the same launch walking its table; q rotated (the backend's)
      cuda::PrefillAttentionParams walking = p, reading = p;
      walking.q_rotated = reading.q_rotated = true;
      void* starts = nullptr;
      CHECK_CUDA(cudaMalloc(&starts, std::max<size_t>(16, cuda::PrefillWorkStartsBytes(p))));
      reading.work_starts = starts;
      CHECK_CUDA(cuda::LaunchLazyPrefillAttention(reading, nullptr));  // makes them
      CHECK_CUDA(cudaDeviceSynchronize());
      reading.work_starts_made = true;
      const auto [reading_ms, walking_ms] =
          AlternatedMedianMs([&] { cuda::LaunchLazyPrefillAttention(reading, nullptr); },
                             [&] { cuda::LaunchLazyPrefillAttention(walking, nullptr); });
      CHECK_CUDA(cudaGetLastError());
      std::printf(
          "      packed, on work starts made before (the backend's later layers): %.4f ms; walking: %.4f ms "
          "(%.3fx)\n",
          reading_ms, walking_ms, walking_ms / reading_ms);
      if (dump_timeline) {
        DumpTimeline(reading, sms, 0, std::string(timeline) + "_questions_starts_" + std::to_string(batch));
      }
      CHECK_CUDA(cudaFree(starts));
    }
    if (dump_timeline) DumpTimeline(p, sms, 0, std::string(timeline) + "_questions_" + std::to_string(batch));
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

// The mixed table (see the top of the file): one launch of `docs` documents being encoded (each
// its own 512 queries over its 512 keys) beside `questions` questions (16 queries over 8 cached
// documents of 512 tokens and themselves), as a lazy step that encodes missed documents and
// answers others runs. Both kernels write the bf16 output the backend's output GEMM reads
// themselves: the one-tile kernel (schedule 2) and the persistent kernel (3, work starts, q
// rotated); alternated. Then the same rows as two launches, the documents' and the questions'
// (each the default launch with the bf16 output wanted, which its launcher converts to where its
// kernel does not write it), against the one launch as the backend runs it: one launch
// takes one heads-per-tile choice, and with a document's 512 queries in it a question's 16 rows
// take a whole 128-row tile per head, where alone they pack 4 heads a tile.
void MixedBench(const double* inv_freq, int heads, int kv_heads, int hd, int block, std::mt19937& rng) {
  constexpr int kDocTokens = 512, kCachedDocs = 8, kQuestion = 16;
  std::printf("\nmixed: documents of %d tokens encoded beside questions of %d tokens over %d cached documents\n",
              kDocTokens, kQuestion, kCachedDocs);
  std::printf("%5s %9s %8s %12s %12s %13s %13s %8s %12s %9s\n", "docs", "questions", "default", "one_tile_ms",
              "persist_ms", "one_TFLOP/s", "pers_TFLOP/s", "ratio", "two_launch", "vs_one");
  for (const auto& [docs, questions] : {std::pair{16, 8}, {48, 16}, {4, 32}, {96, 4}}) {
    std::vector<SeqLayout> seqs;
    std::vector<int> lens, n_q;
    for (int d = 0; d < docs; ++d) {
      seqs.push_back(SeqLayout{0, kDocTokens});
      lens.push_back(kDocTokens);
      n_q.push_back(kDocTokens);
    }
    for (int q = 0; q < questions; ++q) {
      seqs.push_back(SeqLayout{kCachedDocs, kQuestion});
      lens.push_back(kCachedDocs * kDocTokens + kQuestion);
      n_q.push_back(kQuestion);
    }
    PagedBatch b = MakePagedBatch(seqs, kDocTokens, block, kv_heads, hd, rng);
    cuda::PrefillAttentionParams p = QueryParams(b, lens, n_q, inv_freq, heads, kv_heads, hd, block, 91 + docs);
    double pairs = 0;  // query i of n at position L - n + i sees L - n + i + 1 keys
    for (size_t s = 0; s < lens.size(); ++s) pairs += double(n_q[s]) * (lens[s] - n_q[s]) + n_q[s] * (n_q[s] + 1.0) / 2;
    const double flops = 4.0 * hd * heads * pairs;
    const int splits = cuda::ChoosePrefillSplits(p);
    const size_t starts_bytes = cuda::PrefillWorkStartsBytes(p);
    if (splits > 1 || starts_bytes == 0) {
      std::printf("%5d %9d (%d splits, %zu bytes of work starts: no persistent launch)\n", docs, questions, splits,
                  starts_bytes);
    } else {
      void* starts = nullptr;
      __nv_bfloat16* out_bf16 = nullptr;
      const size_t n = static_cast<size_t>(p.total_queries) * heads * hd;
      CHECK_CUDA(cudaMalloc(&starts, starts_bytes));
      CHECK_CUDA(cudaMalloc(&out_bf16, n * sizeof(__nv_bfloat16)));
      p.out_bf16 = out_bf16;  // asked as the backend asks
      const int chosen = cuda::PrefillTakesPersistentKernel(p) ? 3 : 2;
      const auto [one_ms, persistent_ms] = AlternatedMedianMs(
          [&] {
            p.work_starts = starts;  // each kernel makes its own starts, as the backend's first layer does
            p.q_rotated = false;
            p.out_bf16 = out_bf16;
            cuda::detail::LaunchLazyPrefillAttentionVariant(p, cuda::detail::kSpecializedSchedule, nullptr);
          },
          [&] {
            p.work_starts = starts;
            p.q_rotated = true;
            p.out_bf16 = out_bf16;
            cuda::detail::LaunchLazyPrefillAttentionVariant(p, cuda::detail::kPersistentSchedule, nullptr);
          });
      CHECK_CUDA(cudaGetLastError());
      // The two launches: sequences [0, docs) and [docs, docs + questions), each with its rows'
      // part of q, out and out_bf16, its query offsets from 0 and its tables from its first.
      std::vector<cuda::PrefillAttentionParams> parts(2, p);
      std::vector<int32_t*> offsets;
      for (int part = 0; part < 2; ++part) {
        cuda::PrefillAttentionParams& r = parts[part];
        const int first = part == 0 ? 0 : docs, count = part == 0 ? docs : questions;
        const int per = part == 0 ? kDocTokens : kQuestion, row0 = part == 0 ? 0 : docs * kDocTokens;
        std::vector<int32_t> rebased;
        for (int i = 0; i <= count; ++i) rebased.push_back(i * per);
        offsets.push_back(Upload(rebased));
        r.query_offsets = offsets.back();
        r.query_pos0 = p.query_pos0 + first;
        r.kv.table_offsets = p.kv.table_offsets + first;
        r.q = p.q + static_cast<size_t>(row0) * heads * hd;
        r.out = p.out + static_cast<size_t>(row0) * heads * hd;
        r.num_seqs = count;
        r.max_queries_per_seq = per;
        r.max_keys = lens[first];
        r.total_queries = count * per;
        r.work_starts = nullptr;
        r.out_bf16 = out_bf16 + static_cast<size_t>(row0) * heads * hd;
        r.q_rotated = cuda::PrefillTakesPersistentKernel(r);
        if (const size_t ws = cuda::PrefillWorkspaceBytes(r, cuda::ChoosePrefillSplits(r)); ws > 0) {
          CHECK_CUDA(cudaMalloc(&r.workspace, ws));  // the questions' launch may split their keys
        }
      }
      const size_t part_starts =
          std::max(cuda::PrefillWorkStartsBytes(parts[0]), cuda::PrefillWorkStartsBytes(parts[1]));
      void* starts2 = nullptr;
      if (part_starts > 0) CHECK_CUDA(cudaMalloc(&starts2, part_starts));
      const auto [two_ms, one_launch_ms] = AlternatedMedianMs(
          [&] {
            for (cuda::PrefillAttentionParams& r : parts) {
              r.work_starts = starts2;  // made by each launch in turn, as the backend's first layer does
              cuda::LaunchLazyPrefillAttention(r, nullptr);
            }
          },
          [&] {
            // The one launch as the backend runs it: out_bf16 kept where the launch writes it, else
            // cleared and the rows converted after it.
            p.work_starts = nullptr;
            p.out_bf16 = out_bf16;
            const bool writes_bf16 = cuda::PrefillWritesBf16(p);
            if (!writes_bf16) p.out_bf16 = nullptr;
            p.q_rotated = cuda::PrefillTakesPersistentKernel(p);
            p.work_starts = starts;  // every launch's, as the backend passes them
            cuda::LaunchLazyPrefillAttention(p, nullptr);
            if (!writes_bf16) CHECK_CUDA(cuda::LaunchToBf16(p.out, n, out_bf16, nullptr));
          });
      CHECK_CUDA(cudaGetLastError());
      for (int32_t* o : offsets) CHECK_CUDA(cudaFree(o));
      for (const cuda::PrefillAttentionParams& r : parts) {
        if (r.workspace != nullptr) CHECK_CUDA(cudaFree(r.workspace));
      }
      if (starts2 != nullptr) CHECK_CUDA(cudaFree(starts2));
      p.work_starts = nullptr;
      p.out_bf16 = nullptr;
      CHECK_CUDA(cudaFree(starts));
      CHECK_CUDA(cudaFree(out_bf16));
      std::printf("%5d %9d %8d %12.4f %12.4f %13.1f %13.1f %7.3fx %12.4f %8.3fx\n", docs, questions, chosen, one_ms,
                  persistent_ms, flops / one_ms / 1e9, flops / persistent_ms / 1e9, one_ms / persistent_ms, two_ms,
                  one_launch_ms / two_ms);
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
  // The persistent kernel as the backend launches it: with its work starts, made by this launch
  // (the one-tile kernel keeps p's: a caller's made starts, or none).
  cuda::PrefillAttentionParams launch = p;
  void* starts = nullptr;
  if (const size_t bytes = cuda::PrefillWorkStartsBytes(p); persistent && bytes > 0) {
    CHECK_CUDA(cudaMalloc(&starts, bytes));
    launch.work_starts = starts;
    launch.work_starts_made = false;
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
  const bool only_mixed = argc > 1 && std::string(argv[1]) == "mixed";  // that table alone
  const int only_len = argc > 1 && !only_questions && !only_mixed ? std::atoi(argv[1]) : 0;
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
  for (int len : {1024, 2048, 4096, 8192, 16384}) {
    if (only_questions || only_mixed || (only_len != 0 && len != only_len)) continue;
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
      std::printf("  (SM clock after the schedules' pairs: %.0f MHz)\n", SmClockMhz());
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
      // bf16 for the output GEMM (out_bf16: the unsplit one-tile and persistent kernels write only
      // that; other launches convert after them) against the fp32 output and LaunchToBf16 after
      // it, as the backend ran them before, alternated.
      if (const size_t bytes = cuda::PrefillWorkStartsBytes(p); bytes > 0) {
        void* starts = nullptr;
        __nv_bfloat16* out_bf16 = nullptr;
        const size_t n = static_cast<size_t>(p.total_queries) * kHeads * kHd;
        CHECK_CUDA(cudaMalloc(&starts, bytes));
        CHECK_CUDA(cudaMalloc(&out_bf16, n * sizeof(__nv_bfloat16)));
        p.work_starts = starts;
        p.out_bf16 = out_bf16;
        const bool default_persistent = cuda::PrefillTakesPersistentKernel(p);  // asked with bf16 wanted
        p.q_rotated = default_persistent;
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
        // The persistent kernel (q rotated) against the one-tile kernel (raw q), both writing the
        // bf16 output themselves (unsplit), whichever the default takes: the choice's bounds
        // (ChoosePrefillSchedule).
        float persistent_ms = 0, one_tile_ms = 0;
        if (splits == 1) {
          std::tie(persistent_ms, one_tile_ms) = AlternatedMedianMs(
              [&] {
                p.out_bf16 = out_bf16;
                p.q_rotated = true;
                launch_with(b.deltas, cuda::detail::kPersistentSchedule);
              },
              [&] {
                p.out_bf16 = out_bf16;
                p.q_rotated = false;
                launch_with(b.deltas, cuda::detail::kSpecializedSchedule);
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
              "  (output in bf16: persistent kernel, q rotated: %.3f ms, %.1f TFLOP/s; one-tile kernel: "
              "%.3f ms, %.1f TFLOP/s: %.3fx; the default takes the %s)\n",
              persistent_ms, flops / persistent_ms / 1e9, one_tile_ms, flops / one_tile_ms / 1e9,
              one_tile_ms / persistent_ms, default_persistent ? "persistent" : "one-tile");
        }
        std::printf("  (SM clock after the bf16 pairs: %.0f MHz)\n", SmClockMhz());
      }
      FreeQueries(p);
    }
    FreePagedBatch(b);
  }
  if (only_len == 0 && !only_mixed) lazykv::QuestionBench(inv_freq, kHeads, kKvHeads, kHd, kBlock, sms, rng);
  if (only_len == 0 && !only_questions) lazykv::MixedBench(inv_freq, kHeads, kKvHeads, kHd, kBlock, rng);
  return 0;
}
