// The CUDA backend with synthetic:llama3-8b (weights drawn on the GPU):
//  1. ceilings in the same run: pinned host -> device cudaMemcpy of a chunk's bytes, and a
//     large device -> device copy;
//  2. the chunk transfer of a 512-token chunk (32 layers, 8 KV heads, head dim 128, bf16,
//     16-token blocks: 64 MiB) between pool blocks and pinned 256 KiB host pages (as the
//     embedded tier holds it, pinned as it pins them): import (StageChunk + ImportStaged) against the pinned H2D
//     cudaMemcpy and export (CaptureChunk + CopyTo) against the pinned D2H cudaMemcpy of the
//     same bytes in the same run (floor 85% each; also timed in alternation with the memcpy,
//     pair by pair, so drift over the run falls on both), the calling thread's share of each, and
//     from or to a pageable string for information; and 8 imports streamed as the chunk
//     pipeline runs a burst (two stagings in flight) against 8 back-to-back memcpys;
//     The block baseline's materialize (CopyBlocksRotated) of that chunk against a device copy of
//     the same bytes, timed in alternation.
//  3. with --e2e: a Zipf RAG trace (bench/rag_trace.h) through a fresh engine per mode over
//     the one backend, one request at a time, TTFT and throughput per mode;
//  4. with --e2e-batched (alone): the same trace under load through continuous batching
//     (bench/engine_load_bench.h), with the KV pool sized to the GPU as a server's would be.
// usage: see --help
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/cuda_bench_util.h"
#include "bench/engine_load_bench.h"
#include "bench/engine_load_report.h"
#include "bench/rag_trace.h"
#include "cache_server/pinned_memory.h"
#include "common/flag_parser.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/model_ops.h"
#include "worker/backend/cuda_backend.h"
#include "worker/engine/engine.h"
#include "worker/model/synthetic_model.h"

namespace lazykv {
namespace {

// Ends the run with the failing call's status on stderr.
void CheckOk(const absl::Status& status, const char* what) {
  if (status.ok()) return;
  std::fprintf(stderr, "%s: %s\n", what, status.ToString().c_str());
  std::exit(1);
}

double Seconds(std::chrono::steady_clock::time_point a) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
}

// Median wall time of fn() (which synchronizes) over reps runs after 3 warm-ups.
template <typename Fn>
double MedianSeconds(Fn&& fn, int reps) {
  for (int i = 0; i < 3; ++i) fn();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    t.push_back(Seconds(start));
  }
  std::nth_element(t.begin(), t.begin() + reps / 2, t.end());
  return t[reps / 2];
}

// A candidate against its baseline, timed in alternation (baseline, candidate, baseline, ...)
// after 3 warm-ups of each, so that drift of the PCIe link or the clocks over the run falls
// on both alike: the medians of each and the median of the per-pair ratios.
struct Paired {
  double baseline_s, candidate_s, ratio;  // ratio: baseline time / candidate time
};
template <typename Base, typename Candidate>
Paired PairedMedians(Base&& base, Candidate&& candidate, int reps) {
  for (int i = 0; i < 3; ++i) {
    base();
    candidate();
  }
  std::vector<double> b, c, r;
  for (int i = 0; i < reps; ++i) {
    auto start = std::chrono::steady_clock::now();
    base();
    b.push_back(Seconds(start));
    start = std::chrono::steady_clock::now();
    candidate();
    c.push_back(Seconds(start));
    r.push_back(b.back() / c.back());
  }
  auto median = [](std::vector<double>& v) {
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    return v[v.size() / 2];
  };
  return Paired{median(b), median(c), median(r)};
}

double ScatterBench(Backend& backend) {
  const ModelConfig& c = backend.config();
  const int tokens = 512, bs = backend.block_size();
  const ChunkLayout layout = MakeChunkLayout(c, KvDtype::kBf16, tokens, 1);
  const size_t bytes = layout.payload_bytes();
  char* pinned = nullptr;
  CHECK_CUDA(cudaMallocHost(&pinned, bytes));
  std::mt19937_64 rng(7);
  for (size_t i = 0; i < bytes; i += 8) {
    const uint64_t r = rng() & 0x3f7f3f7f3f7f3f7fULL;  // finite bf16 values
    std::memcpy(pinned + i, &r, std::min<size_t>(8, bytes - i));
  }
  std::string pageable(pinned, bytes);
  // Blocks scattered over the pool, as a fetched chunk would get them.
  std::vector<int32_t> ids(backend.num_blocks());
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<KvBlockRef> blocks;
  for (int t = 0; t < tokens; t += bs) blocks.push_back(KvBlockRef{ids[blocks.size()], std::min(bs, tokens - t), 0});

  void* device = nullptr;
  CHECK_CUDA(cudaMalloc(&device, bytes));
  char* pinned_out = nullptr;
  CHECK_CUDA(cudaMallocHost(&pinned_out, bytes));
  auto h2d = [&] { CHECK_CUDA(cudaMemcpy(device, pinned, bytes, cudaMemcpyHostToDevice)); };
  auto d2h = [&] { CHECK_CUDA(cudaMemcpy(pinned_out, device, bytes, cudaMemcpyDeviceToHost)); };
  const double memcpy_s = MedianSeconds(h2d, 30);
  const double d2h_s = MedianSeconds(d2h, 30);
  // The payload as the embedded tier holds it: 256 KiB pinned pages, the first one shared
  // with the 128-byte chunk header.
  // The pages lie in the arena in no particular order (its free list), so the pieces are
  // taken from shuffled page slots of one pinned region: none is adjacent to the next.
  const size_t page = 256 << 10;
  const size_t num_pages = (bytes + kChunkHeaderBytes + page - 1) / page;
  // Pinned as the tier pins its arena (cache::PinHostMemory), which the chunk transfer
  // finds in its registry of mapped regions.
  char* in_pages = static_cast<char*>(std::aligned_alloc(4096, num_pages * page));
  char* out_pages = static_cast<char*>(std::aligned_alloc(4096, num_pages * page));
  if (!cache::PinHostMemory(in_pages, num_pages * page) || !cache::PinHostMemory(out_pages, num_pages * page)) {
    std::fprintf(stderr, "could not pin the pages\n");
    std::exit(1);
  }
  std::vector<size_t> slot(num_pages);
  std::iota(slot.begin(), slot.end(), 0);
  std::shuffle(slot.begin(), slot.end(), rng);
  for (size_t i = 0; i + 1 < num_pages; ++i) {
    if (slot[i] + 1 == slot[i + 1]) std::swap(slot[i + 1], slot[(i + 2) % num_pages]);  // rarely adjacent; break it
  }
  std::vector<std::string_view> in_pieces;
  MutablePieces out_pieces;
  for (size_t at = 0, p = 0, n = page - kChunkHeaderBytes; at < bytes; at += n, n = page, ++p) {
    n = std::min(n, bytes - at);
    const size_t in_page = p == 0 ? kChunkHeaderBytes : 0;
    std::memcpy(in_pages + slot[p] * page + in_page, pinned + at, n);
    in_pieces.emplace_back(in_pages + slot[p] * page + in_page, n);
    out_pieces.emplace_back(out_pages + slot[p] * page + in_page, n);
  }
  const ChunkBytes paged(in_pieces, nullptr);
  double enqueue_import_s = 0;
  std::vector<double> stage_s;  // StageChunk alone (the H2D copy into device staging)
  auto import_paged = [&] {
    const auto stage_start = std::chrono::steady_clock::now();
    auto staged = backend.StageChunk(paged, {.check_finite = true});  // a pipeline thread's part
    stage_s.push_back(Seconds(stage_start));
    if (!staged.ok()) {
      std::fprintf(stderr, "StageChunk: %s\n", staged.status().ToString().c_str());
      std::exit(1);
    }
    const auto start = std::chrono::steady_clock::now();
    const absl::Status s = backend.ImportStaged(*std::move(staged), blocks);  // the scheduling thread's part
    enqueue_import_s = std::max(enqueue_import_s, Seconds(start));
    if (!s.ok()) {
      std::fprintf(stderr, "ImportStaged: %s\n", s.ToString().c_str());
      std::exit(1);
    }
    CHECK_CUDA(cudaDeviceSynchronize());  // the scatter done
  };
  const double import_s = MedianSeconds(import_paged, 30);
  std::nth_element(stage_s.begin(), stage_s.begin() + stage_s.size() / 2, stage_s.end());
  const double stage_median_s = stage_s[stage_s.size() / 2];
  const Paired import_paired = PairedMedians(h2d, import_paged, 40);
  double enqueue_capture_s = 0;
  auto export_paged = [&] {
    const auto start = std::chrono::steady_clock::now();
    auto captured = backend.CaptureChunk(blocks);  // the scheduling thread's part
    enqueue_capture_s = std::max(enqueue_capture_s, Seconds(start));
    CheckOk(captured.status(), "CaptureChunk");
    CheckOk((*captured)->CopyTo(out_pieces), "CopyTo");  // a publisher thread's part
  };
  // Streamed, as the chunk pipeline imports a burst: 8 chunks staged two at a time (its
  // gate's width) by two threads, each imported on this thread as it arrives, against 8
  // pinned memcpys of the same bytes back to back.
  constexpr int kStreamed = 8;
  auto import_streamed = [&] {
    std::mutex mu;
    std::condition_variable ready_cv;
    std::vector<std::unique_ptr<StagedChunk>> ready;
    std::vector<std::thread> stagers;
    for (int t = 0; t < 2; ++t) {
      stagers.emplace_back([&, t] {
        for (int c = t; c < kStreamed; c += 2) {
          auto staged = backend.StageChunk(paged, {.check_finite = true});
          CheckOk(staged.status(), "StageChunk");
          std::lock_guard<std::mutex> lock(mu);
          ready.push_back(*std::move(staged));
          ready_cv.notify_one();
        }
      });
    }
    for (int imported = 0; imported < kStreamed; ++imported) {
      std::unique_ptr<StagedChunk> next;
      {
        std::unique_lock<std::mutex> lock(mu);
        ready_cv.wait(lock, [&] { return !ready.empty(); });
        next = std::move(ready.back());
        ready.pop_back();
      }
      CheckOk(backend.ImportStaged(std::move(next), blocks), "ImportStaged");
    }
    for (std::thread& t : stagers) t.join();
    CHECK_CUDA(cudaDeviceSynchronize());
  };
  auto h2d_streamed = [&] {
    for (int c = 0; c < kStreamed; ++c) CHECK_CUDA(cudaMemcpyAsync(device, pinned, bytes, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaDeviceSynchronize());
  };
  const Paired streamed = PairedMedians(h2d_streamed, import_streamed, 10);
  const double export_s = MedianSeconds(export_paged, 30);
  const Paired export_paired = PairedMedians(d2h, export_paged, 40);
  bool same = true;
  for (size_t i = 0, at = 0; i < out_pieces.size(); at += out_pieces[i].size(), ++i) {
    same = same && std::memcmp(out_pieces[i].data(), pinned + at, out_pieces[i].size()) == 0;
  }
  const double memcpy2_s = MedianSeconds(h2d, 30);
  const double d2h2_s = MedianSeconds(d2h, 30);
  const double pageable_s = MedianSeconds(
      [&] {
        CheckOk(backend.ImportChunk(pageable, blocks), "ImportChunk");
        CHECK_CUDA(cudaDeviceSynchronize());
      },
      10);
  std::string exported;
  const double export_string_s =
      MedianSeconds([&] { CheckOk(backend.ExportChunk(blocks, &exported), "ExportChunk"); }, 10);
  const bool same_string = exported.size() == bytes && std::memcmp(exported.data(), pinned, bytes) == 0;
  // Device-to-device ceiling: 1 GiB copy, bytes read plus written.
  const size_t big = 1ull << 30;
  void *a = nullptr, *b = nullptr;
  CHECK_CUDA(cudaMalloc(&a, big));
  CHECK_CUDA(cudaMalloc(&b, big));
  CHECK_CUDA(cudaMemset(a, 1, big));
  const double d2d_s = MedianSeconds(
      [&] {
        CHECK_CUDA(cudaMemcpy(b, a, big, cudaMemcpyDeviceToDevice));
        CHECK_CUDA(cudaDeviceSynchronize());
      },
      20);
  // The block baseline's materialize (CopyBlocksRotated: keys re-rotated, values copied)
  // of the chunk's blocks into fresh blocks, against a device copy of the same bytes,
  // timed in alternation.
  std::vector<BlockCopy> copies;
  for (size_t i = 0; i < blocks.size(); ++i) {
    copies.push_back(BlockCopy{blocks[i].block, ids[blocks.size() + i], blocks[i].num_tokens, 1000});
  }
  const Paired materialize = PairedMedians(
      [&] {
        CHECK_CUDA(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
        CHECK_CUDA(cudaDeviceSynchronize());
      },
      [&] {
        CheckOk(backend.CopyBlocksRotated(copies), "CopyBlocksRotated");
        CHECK_CUDA(cudaDeviceSynchronize());
      },
      40);
  const double gb = bytes / 1e9;
  const double memcpy_best = std::min(memcpy_s, memcpy2_s);
  const double d2h_best = std::min(d2h_s, d2h2_s);
  std::printf("ceiling: device-to-device copy %.0f GB/s (read + write, 1 GiB)\n", 2 * big / 1e9 / d2d_s);
  std::printf(
      "materialize (block's copy, keys re-rotated) of the chunk: %.3f ms, %.0f GB/s read + write; a device copy of "
      "the same bytes %.3f ms, %.0f GB/s; materialize at %.1f%% of the copy (paired medians, 40 pairs)\n",
      materialize.candidate_s * 1e3, 2 * bytes / 1e9 / materialize.candidate_s, materialize.baseline_s * 1e3,
      2 * bytes / 1e9 / materialize.baseline_s, 100.0 * materialize.ratio);
  std::printf("chunk: %d tokens, %d layers, %d KV heads, head dim %d, bf16, %d-token blocks: %.1f MiB in %zu blocks\n",
              tokens, c.n_layers, c.n_kv_heads, c.head_dim, bs, bytes / 1048576.0, blocks.size());
  std::printf("pinned cudaMemcpy H2D      %8.3f ms %7.2f GB/s (before), %7.2f GB/s (after)\n", memcpy_s * 1e3,
              gb / memcpy_s, gb / memcpy2_s);
  std::printf("pinned cudaMemcpy D2H      %8.3f ms %7.2f GB/s (before), %7.2f GB/s (after)\n", d2h_s * 1e3, gb / d2h_s,
              gb / d2h2_s);
  std::printf(
      "import: StageChunk from %zu pinned 256 KiB pieces + ImportStaged %8.3f ms %7.2f GB/s = %.1f%% of the best "
      "pinned H2D memcpy (floor 85%%); ImportStaged on the calling thread at most %.3f ms; StageChunk alone "
      "%.3f ms (%.1f%%)\n",
      in_pieces.size(), import_s * 1e3, gb / import_s, 100.0 * memcpy_best / import_s, enqueue_import_s * 1e3,
      stage_median_s * 1e3, 100.0 * memcpy_best / stage_median_s);
  std::printf(
      "export: CaptureChunk + CopyTo into %zu pinned 256 KiB pieces %8.3f ms %7.2f GB/s = %.1f%% of the best "
      "pinned D2H memcpy (floor 85%%); CaptureChunk on the calling thread at most %.3f ms; round trip %s\n",
      out_pieces.size(), export_s * 1e3, gb / export_s, 100.0 * d2h_best / export_s, enqueue_capture_s * 1e3,
      same ? "exact" : "DIFFERS");
  std::printf(
      "paired with the memcpy in alternation (40 pairs): import %.3f ms vs H2D %.3f ms, median ratio %.1f%%; "
      "export %.3f ms vs D2H %.3f ms, median ratio %.1f%% (floor 85%%)\n",
      import_paired.candidate_s * 1e3, import_paired.baseline_s * 1e3, 100.0 * import_paired.ratio,
      export_paired.candidate_s * 1e3, export_paired.baseline_s * 1e3, 100.0 * export_paired.ratio);
  std::printf(
      "import streamed (%d chunks, two stagings in flight, each imported as it lands): %.3f ms vs %d pinned H2D "
      "memcpys %.3f ms, median ratio %.1f%% (10 pairs)\n",
      kStreamed, streamed.candidate_s * 1e3, kStreamed, streamed.baseline_s * 1e3, 100.0 * streamed.ratio);
  std::printf(
      "import from one pageable string %8.3f ms %7.2f GB/s; export to a string %8.3f ms %7.2f GB/s; round trip %s\n",
      pageable_s * 1e3, gb / pageable_s, export_string_s * 1e3, gb / export_string_s,
      same_string ? "exact" : "DIFFERS");
  cudaFreeHost(pinned_out);
  cache::UnpinHostMemory(in_pages);
  cache::UnpinHostMemory(out_pages);
  std::free(in_pages);
  std::free(out_pages);
  cudaFree(a);
  cudaFree(b);
  cudaFree(device);
  cudaFreeHost(pinned);
  return 2 * big / 1e9 / d2d_s;  // HBM traffic rate of the copy (read + write)
}

// Where a batch-1 decode step's time goes: the step through the engine (context of about
// 4k tokens) against its GEMMs alone (one layer's matrices, random, run n_layers times, plus
// the classifier; one layer's weights exceed the L2, so this streams from HBM) and against
// streaming every weight once at the HBM rate of the device-to-device copy; and those GEMMs
// at 1 to 8 rows by the skinny kernel against cuBLASLt, alternated.
void DecodeBench(Backend& backend, double hbm_gbs, bool backend_skinny_gemm) {
  const ModelConfig& c = backend.config();
  const size_t dim = c.dim, q = c.q_dim(), kv = c.kv_dim(), hidden = c.hidden_dim, vocab = c.vocab_size;
  struct Mat {
    size_t out, in;
  };
  const Mat mats[] = {{q + 2 * kv, dim}, {dim, q}, {2 * hidden, dim}, {dim, hidden}};
  std::vector<__nv_bfloat16*> w;
  size_t layer_bytes = 0;
  for (const Mat& m : mats) {
    __nv_bfloat16* p = nullptr;
    CHECK_CUDA(cudaMalloc(&p, m.out * m.in * 2));
    CHECK_CUDA(cuda::LaunchSyntheticFill(w.size() + 1, m.out * m.in, 0.02f, false, p, nullptr, nullptr));
    w.push_back(p);
    layer_bytes += m.out * m.in * 2;
  }
  __nv_bfloat16 *cls = nullptr, *x = nullptr;
  float* y = nullptr;
  CHECK_CUDA(cudaMalloc(&cls, vocab * dim * 2));
  CHECK_CUDA(cuda::LaunchSyntheticFill(9, vocab * dim, 0.02f, false, cls, nullptr, nullptr));
  constexpr size_t kMaxRows = 8;  // room for the 8-row products below
  CHECK_CUDA(cudaMalloc(&x, kMaxRows * 2 * hidden * 2));
  CHECK_CUDA(cuda::LaunchSyntheticFill(10, kMaxRows * 2 * hidden, 1.0f, false, x, nullptr, nullptr));
  CHECK_CUDA(cudaMalloc(&y, kMaxRows * std::max<size_t>(2 * hidden, vocab) * 4));
  // A step's GEMMs at `rows` rows through `gemm`, one layer's matrices n_layers times.
  auto step_gemms_ms = [&](cuda::Gemm& gemm, int rows) {
    return bench::MedianMs(
        [&] {
          for (int l = 0; l < c.n_layers; ++l) {
            for (size_t i = 0; i < 4; ++i) {
              if (!gemm.Run(x, rows, static_cast<int>(mats[i].in), w[i], static_cast<int>(mats[i].out), y).ok())
                std::exit(1);
            }
          }
          if (!gemm.Run(x, rows, static_cast<int>(dim), cls, static_cast<int>(vocab), y).ok()) std::exit(1);
        },
        20);
  };
  auto skinny = cuda::Gemm::Create(nullptr);
  auto lt = cuda::Gemm::Create(nullptr, cuda::GemmOptions{.skinny_kernel = false});
  if (!skinny.ok() || !lt.ok()) std::exit(1);
  // Alternated, so drift falls on both; the skinny kernel at 1 to 8 rows (decode batches),
  // against cuBLASLt's tensor-core tiles.
  constexpr int kRowCounts = 8;
  float lt_ms[kRowCounts], skinny_ms[kRowCounts];
  for (int i = 0; i < kRowCounts; ++i) lt_ms[i] = skinny_ms[i] = 1e9f;
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < kRowCounts; ++i) {
      lt_ms[i] = std::min(lt_ms[i], step_gemms_ms(**lt, i + 1));
      skinny_ms[i] = std::min(skinny_ms[i], step_gemms_ms(**skinny, i + 1));
    }
  }
  const float gemm_ms = backend_skinny_gemm ? skinny_ms[0] : lt_ms[0];
  const double weight_bytes = static_cast<double>(layer_bytes) * c.n_layers + vocab * dim * 2.0;
  for (auto* p : w) cudaFree(p);
  cudaFree(cls);
  cudaFree(x);
  cudaFree(y);

  EngineOptions options;
  options.mode = AttentionMode::kLazy;
  auto engine = Engine::Create(std::make_unique<BorrowedBackend>(&backend), options);
  if (!engine.ok()) std::exit(1);
  std::mt19937_64 rng(3);
  GenerateRequest request;
  for (int d = 0; d < 8; ++d) {
    std::vector<int32_t> doc(512);
    for (int32_t& t : doc) t = static_cast<int32_t>(3 + rng() % (c.vocab_size - 3));
    request.docs.push_back(doc);
  }
  request.prompt = {100, 200, 300};
  request.sampling.max_tokens = 65;
  double step_ms = 0;
  for (int rep = 0; rep < 2; ++rep) {  // the second run: chunks cached, clocks up
    auto result = (*engine)->Generate(request);
    if (!result.ok()) std::exit(1);
    step_ms = (result->total_seconds - result->ttft_seconds) * 1e3 / (result->tokens.size() - 1);
  }
  std::printf(
      "\ndecode step, batch 1, context ~4.1k: %.2f ms through the engine (GEMMs by %s); its GEMMs alone %.2f ms "
      "(%.0f GB/s of weights); streaming %.2f GB of weights at the copy's HBM rate (read + write) %.2f ms\n",
      step_ms, backend_skinny_gemm ? "the skinny kernel" : "cuBLASLt", gemm_ms, weight_bytes / 1e9 / (gemm_ms / 1e3),
      weight_bytes / 1e9, weight_bytes / 1e9 / hbm_gbs * 1e3);
  std::printf("backend: %s\n", backend.ProfileSummary().c_str());
  for (int i = 0; i < kRowCounts; ++i) {
    std::printf(
        "a step's GEMMs at %d row(s): skinny kernel %.3f ms (%.0f GB/s of weights), cuBLASLt %.3f ms (%.0f GB/s): "
        "%.3fx\n",
        i + 1, skinny_ms[i], weight_bytes / 1e9 / (skinny_ms[i] / 1e3), lt_ms[i], weight_bytes / 1e9 / (lt_ms[i] / 1e3),
        lt_ms[i] / skinny_ms[i]);
  }
}

// The paper's workload: 100 documents of 512 tokens, 8 per request, Zipf s = 1.1.
RagTrace RagWorkload(int vocab_size, int num_requests, int max_tokens, uint64_t seed) {
  TraceOptions options;
  options.num_docs = 100;
  options.docs_per_request = 8;
  options.zipf_s = 1.1;
  options.num_requests = num_requests;
  options.doc_lengths = "fixed:512";
  options.max_tokens = max_tokens;
  options.vocab_size = vocab_size;
  options.seed = seed;
  auto trace = GenerateTrace(options);
  if (!trace.ok()) {
    std::fprintf(stderr, "trace: %s\n", std::string(trace.status().message()).c_str());
    std::exit(1);
  }
  return *std::move(trace);
}

// One request at a time (Engine::Generate): TTFT without queueing, throughput at batch 1.
void EndToEnd(Backend& backend, int num_requests, int max_tokens) {
  const RagTrace trace = RagWorkload(backend.config().vocab_size, num_requests, max_tokens, 1);
  std::printf(
      "\nend to end: synthetic:llama3-8b, Zipf trace (100 documents of 512 tokens, 8 per request, s = 1.1, "
      "%d requests, %d new tokens each), closed loop, one engine per mode over one backend\n",
      num_requests, max_tokens);
  std::printf("%-7s %12s %12s %12s %10s %10s %10s %12s\n", "mode", "mean_ttft_ms", "p50_ttft_ms", "p90_ttft_ms",
              "req_per_s", "tok_per_s", "cached", "computed");
  const std::vector<AttentionMode> modes = {AttentionMode::kNone, AttentionMode::kPrefix, AttentionMode::kBlock,
                                            AttentionMode::kLazy};
  for (AttentionMode mode : modes) {  // every mode warmed alike, on a throwaway engine
    EngineOptions engine_options;
    engine_options.mode = mode;
    auto engine = Engine::Create(std::make_unique<BorrowedBackend>(&backend), engine_options);
    if (!engine.ok()) std::exit(1);
    for (const GenerateRequest& request : TraceToRequests(RagWorkload(backend.config().vocab_size, 4, 8, 2))) {
      if (!(*engine)->Generate(request).ok()) std::exit(1);
    }
  }
  for (AttentionMode mode : modes) {
    EngineOptions engine_options;
    engine_options.mode = mode;
    auto engine = Engine::Create(std::make_unique<BorrowedBackend>(&backend), engine_options);
    if (!engine.ok()) std::exit(1);
    std::vector<double> ttft;
    long cached = 0, computed = 0, generated = 0;
    const auto start = std::chrono::steady_clock::now();
    for (const GenerateRequest& request : TraceToRequests(trace)) {
      auto result = (*engine)->Generate(request);
      if (!result.ok()) {
        std::fprintf(stderr, "%s: %s\n", std::string(AttentionModeName(mode)).c_str(),
                     std::string(result.status().message()).c_str());
        std::exit(1);
      }
      ttft.push_back(result->ttft_seconds * 1e3);
      cached += result->usage.cached_tokens;
      computed += result->usage.computed_tokens;
      generated += static_cast<long>(result->tokens.size());
    }
    const double total = Seconds(start);
    const double mean = std::accumulate(ttft.begin(), ttft.end(), 0.0) / ttft.size();
    std::sort(ttft.begin(), ttft.end());
    std::printf("%-7s %12.2f %12.2f %12.2f %10.2f %10.1f %10ld %12ld\n", std::string(AttentionModeName(mode)).c_str(),
                mean, ttft[ttft.size() / 2], ttft[ttft.size() * 9 / 10], ttft.size() / total, generated / total, cached,
                computed);
  }
}

// Like vLLM's gpu_memory_utilization: the pool takes what is left of that fraction of the
// GPU's memory once the weights and room for activations are counted.
int PoolBlocksForUtilization(const ModelConfig& config, double utilization) {
  size_t free_bytes = 0, total_bytes = 0;
  CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total_bytes));
  const double weight_bytes = Fp32WeightBytes(config) / 2.0;  // bf16 on the GPU
  const double activation_bytes = 2.0 * (1ull << 30);         // forward buffers, logits, workspaces
  const double pool_bytes =
      utilization * total_bytes - static_cast<double>(total_bytes - free_bytes) - weight_bytes - activation_bytes;
  return std::max(0, static_cast<int>(pool_bytes / CudaKvBytesPerBlock(config, 16)));
}

struct BatchedOptions {
  int requests = 256, max_tokens = 128;
  LoadOptions load;
  std::vector<AttentionMode> modes = {AttentionMode::kNone, AttentionMode::kPrefix, AttentionMode::kBlock,
                                      AttentionMode::kLazy};
  std::string out = "e2e_batched.json";
  // Backend::WarmUp before the first mode (as lazykv-worker does before serving); off, the
  // first mode meets every new step shape cold and the later ones do not.
  bool backend_warm_up = true;
};

// A loaded server: the trace through continuous batching at a request rate and concurrency,
// one fresh engine per mode over the backend (bench/engine_load_bench.h).
int EndToEndBatched(Backend& backend, const BatchedOptions& options, const std::string& gpu) {
  const RagTrace trace = RagWorkload(backend.config().vocab_size, options.requests, options.max_tokens, 1);
  if (options.backend_warm_up) {  // every step shape of an engine with the defaults' running requests
    const int running = EngineOptions{}.max_running_requests;
    if (absl::Status s = backend.WarmUp(options.load.max_prefill_tokens + running, running); !s.ok()) {
      std::fprintf(stderr, "backend warm-up: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  {  // Warm-up (cuBLASLt plans, buffers grown, each mode's kernels) on throwaway engines, every mode alike.
    const RagTrace warmup = RagWorkload(backend.config().vocab_size, 8, 8, 2);
    if (auto w = RunModesUnderLoad(backend, warmup, options.modes, options.load); !w.ok()) {
      std::fprintf(stderr, "warm-up: %s\n", w.status().ToString().c_str());
      return 1;
    }
  }
  const double rate = options.load.request_rate;
  const std::string rate_text = std::isfinite(rate) ? absl::StrFormat("%g/s", rate) : "inf";
  const std::string concurrency_text =
      options.load.max_concurrency > 0 ? absl::StrCat(options.load.max_concurrency) : "unlimited";
  std::printf(
      "\nend to end, batched: synthetic:llama3-8b, Zipf trace (100 documents of 512 tokens, 8 per request, "
      "s = 1.1, %d requests, %d new tokens each), request rate %s, max concurrency %s, %d prefill tokens per "
      "step; one fresh engine per mode over one backend\n",
      options.requests, options.max_tokens, rate_text.c_str(), concurrency_text.c_str(),
      options.load.max_prefill_tokens);
  const nlohmann::json setup = {
      {"gpu", gpu},
      {"model", "synthetic:llama3-8b"},
      {"trace", TraceOptionsToJson(trace.options)},
      {"request_rate", std::isfinite(rate) ? nlohmann::json(rate) : nlohmann::json("inf")},
      {"max_concurrency", options.load.max_concurrency},
      {"max_prefill_tokens", options.load.max_prefill_tokens},
      {"block_size", backend.block_size()},
      {"kv_pool_blocks", backend.num_blocks()},
      {"kv_pool_gib", static_cast<double>(backend.num_blocks()) * backend.kv_bytes_per_block() / (1ull << 30)}};
  if (absl::Status s = RunModesAndReport(backend, trace, options.modes, options.load, setup, options.out); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace lazykv

int main(int argc, char** argv) {
  using namespace lazykv;
  bool e2e = false, batched = false;
  int requests = -1, max_tokens = -1;  // per benchmark defaults
  double pool_gib = 0, utilization = 0.9;
  BatchedOptions batched_options;
  std::string modes, shared_decode = "auto", mixed_steps = "decode";
  FlagParser parser(
      "usage: cuda_backend_bench [--e2e] [--requests N] [--max-tokens N] [--kv-pool-gib G]\n"
      "       cuda_backend_bench --e2e-batched [--requests N] [--max-tokens N] [--request-rate R|inf]\n"
      "           [--max-concurrency C (0: none)] [--max-prefill-tokens N] [--modes none,prefix,block,lazy]\n"
      "           [--kv-pool-gib G | --gpu-memory-utilization F] [--shared-decode auto|always|off]\n"
      "           [--mixed-steps decode|prefill] [--no-backend-warm-up] [--no-skinny-gemm] [--out FILE.json]\n"
      "Without --e2e-batched: chunk import and decode ceilings, then with --e2e the trace one request\n"
      "at a time (40 requests, 16 tokens, 12 GiB pool). --e2e-batched runs only the loaded benchmark\n"
      "(256 requests, 128 tokens, rate inf, concurrency 64; the pool takes what is left of 0.9 of the\n"
      "GPU's memory after the weights unless --kv-pool-gib says).\n");
  parser.AddSwitch("--e2e", &e2e);
  parser.AddSwitch("--e2e-batched", &batched);
  parser.AddInt("--requests", &requests);
  parser.AddInt("--max-tokens", &max_tokens);
  parser.AddDouble("--kv-pool-gib", &pool_gib);
  parser.AddDouble("--gpu-memory-utilization", &utilization);
  parser.AddDouble("--request-rate", &batched_options.load.request_rate);
  parser.AddInt("--max-concurrency", &batched_options.load.max_concurrency);
  parser.AddInt("--max-prefill-tokens", &batched_options.load.max_prefill_tokens);
  parser.AddString("--modes", &modes);
  parser.AddString("--shared-decode", &shared_decode);
  parser.AddString("--mixed-steps", &mixed_steps);
  parser.AddString("--out", &batched_options.out);
  bool no_backend_warm_up = false, no_skinny_gemm = false;
  parser.AddSwitch("--no-backend-warm-up", &no_backend_warm_up);
  parser.AddSwitch("--no-skinny-gemm", &no_skinny_gemm);
  if (absl::Status s = parser.Parse(argc, argv); !s.ok()) return ExitForFlagError(s, "cuda_backend_bench");
  if (!modes.empty()) {
    batched_options.modes.clear();
    const std::vector<std::string> names = absl::StrSplit(modes, ',', absl::SkipEmpty());
    for (const std::string& name : names) {
      auto mode = ParseAttentionMode(name);
      if (!mode.ok()) {
        return ExitForFlagError(absl::InvalidArgumentError(absl::StrCat("--modes: ", mode.status().message())),
                                "cuda_backend_bench");
      }
      batched_options.modes.push_back(*mode);
    }
  }
  CudaBackendOptions backend_options;
  if (shared_decode == "always") {
    backend_options.shared_decode = SharedDecode::kAlways;
  } else if (shared_decode == "off") {
    backend_options.shared_decode = SharedDecode::kOff;
  } else if (shared_decode != "auto") {
    return ExitForFlagError(absl::InvalidArgumentError("--shared-decode: one of auto, always, off"),
                            "cuda_backend_bench");
  }
  if (mixed_steps != "decode" && mixed_steps != "prefill") {
    return ExitForFlagError(absl::InvalidArgumentError("--mixed-steps: decode or prefill"), "cuda_backend_bench");
  }
  backend_options.decode_in_mixed_steps = mixed_steps == "decode";
  backend_options.skinny_gemm = !no_skinny_gemm;
  batched_options.backend_warm_up = !no_backend_warm_up;
  if (batched) {
    if (requests > 0) batched_options.requests = requests;
    if (max_tokens >= 0) batched_options.max_tokens = max_tokens;
  }
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("GPU: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  const ModelConfig config = *SyntheticConfig("llama3-8b");
  const uint64_t block_bytes = CudaKvBytesPerBlock(config, 16);
  // The ceilings below allocate beside the pool, so only the batched run sizes it to the GPU.
  const int blocks = pool_gib > 0 ? static_cast<int>(pool_gib * 1073741824.0 / block_bytes)
                     : batched    ? PoolBlocksForUtilization(config, utilization)
                                  : static_cast<int>(12 * 1073741824.0 / block_bytes);
  const auto start = std::chrono::steady_clock::now();
  auto backend = CreateSyntheticCudaBackend(config, 0, 16, blocks, backend_options);
  if (!backend.ok()) {
    std::fprintf(stderr, "backend: %s\n", std::string(backend.status().message()).c_str());
    return 1;
  }
  std::printf("synthetic:llama3-8b drawn on the GPU in %.2f s; KV pool %d blocks of 16 tokens (%.2f GiB)\n",
              Seconds(start), blocks, static_cast<double>(blocks) * block_bytes / 1073741824.0);
  if (batched) {
    const int rc = EndToEndBatched(**backend, batched_options, prop.name);
    const SharedDecodeStats shared = CudaSharedDecodeStats(**backend);
    std::printf(
        "chunk-shared decode (--shared-decode %s, --mixed-steps %s): %llu steps, %llu KV tokens per layer "
        "not read again\n",
        shared_decode.c_str(), mixed_steps.c_str(), static_cast<unsigned long long>(shared.steps),
        static_cast<unsigned long long>(shared.tokens_saved));
    std::printf("backend: %s\n", (*backend)->ProfileSummary().c_str());
    return rc;
  }
  const double hbm_gbs = ScatterBench(**backend);
  DecodeBench(**backend, hbm_gbs, backend_options.skinny_gemm);
  if (e2e) EndToEnd(**backend, requests > 0 ? requests : 40, max_tokens >= 0 ? max_tokens : 16);
  return 0;
}
