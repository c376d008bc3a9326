// The CUDA backend with synthetic:llama3-8b (weights drawn on the GPU):
//  1. the chunk transfer and its ceilings (bench/cuda_chunk_transfer_bench.cc): a 512-token
//     chunk's import and export between pool blocks and shuffled pinned 256 KiB host pages
//     against the pinned memcpy of the same bytes in the same run (floor 85% each), and the
//     block baseline's materialize against a device copy;
//  2. a batch-1 decode step through the engine against its GEMMs alone and the weight
//     streaming floor, the GEMMs at 1-8 rows by the skinny kernel and at 5-64 by the
//     tensor-core skinny kernel, each against cuBLASLt;
//  3. with --e2e: a Zipf RAG trace (bench/rag_trace.h) through a fresh engine per mode over
//     the one backend, one request at a time, TTFT and throughput per mode;
//  4. with --e2e-batched (alone): the same trace under load through continuous batching
//     (bench/engine_load_bench.h), with the KV pool sized to the GPU as a server's would be.
// usage: see --help
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/cuda_bench_util.h"
#include "bench/cuda_chunk_transfer_bench.h"
#include "bench/engine_load_bench.h"
#include "bench/engine_load_report.h"
#include "bench/kernel_trace.h"
#include "bench/rag_trace.h"
#include "bench/wall_timing.h"
#include "common/flag_parser.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/skinny_gemm.h"
#include "kernels/cuda/skinny_mma_gemm.h"
#include "worker/backend/cuda_backend.h"
#include "worker/engine/engine.h"
#include "worker/model/synthetic_model.h"

namespace lazykv {
namespace {

using bench::Seconds;  // bench/wall_timing.h

// Where a batch-1 decode step's time goes: the step through the engine (context of about
// 4k tokens) against its GEMMs alone (one layer's matrices, random, run n_layers times, plus
// the classifier; one layer's weights exceed the L2, so this streams from HBM) and against
// streaming every weight once at the HBM rate of the device-to-device copy; and those GEMMs
// at 1 to 8 rows by the skinny kernel against cuBLASLt, alternated.
// With --kernel-trace: fn's GPU work (bench/kernel_trace.h) summarized per step.
template <typename Fn>
void TraceSteps(const char* what, int steps, Fn&& fn) {
  auto trace = bench::KernelTrace::Start();
  if (!trace.ok()) {
    std::printf("kernel trace (%s): %s\n", what, trace.status().ToString().c_str());
    return;
  }
  fn();
  const std::vector<bench::TraceRecord> records = (*trace)->Stop();
  std::printf("\nkernel trace: %s\n%s", what, bench::SummarizeTrace(records, steps).c_str());
  std::printf(
      "(with dependent launches, the default, a decode kernel's time includes its wait for the one before, so "
      "per-kernel times overlap; LAZYKV_DEPENDENT_LAUNCH=0 separates them)\n");
}

void DecodeBench(Backend& backend, double hbm_gbs, bool backend_skinny_gemm, bool kernel_trace) {
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
  constexpr size_t kMaxRows = 64;  // room for the 64-row products below
  CHECK_CUDA(cudaMalloc(&x, kMaxRows * 2 * hidden * 2));
  CHECK_CUDA(cuda::LaunchSyntheticFill(10, kMaxRows * 2 * hidden, 1.0f, false, x, nullptr, nullptr));
  CHECK_CUDA(cudaMalloc(&y, kMaxRows * std::max<size_t>(2 * hidden, vocab) * 4));
  // A step's GEMMs (one layer's matrices n_layers times, then the classifier), each product
  // run by `product(in, w, out)`, which says whether it launched.
  auto step_gemm_loop_ms = [&](const auto& product) {
    return bench::MedianMs(
        [&] {
          for (int l = 0; l < c.n_layers; ++l) {
            for (size_t i = 0; i < 4; ++i) {
              if (!product(static_cast<int>(mats[i].in), w[i], static_cast<int>(mats[i].out))) std::exit(1);
            }
          }
          if (!product(static_cast<int>(dim), cls, static_cast<int>(vocab))) std::exit(1);
        },
        20);
  };
  // At `rows` rows through `gemm`.
  auto step_gemms_ms = [&](cuda::Gemm& gemm, int rows) {
    return step_gemm_loop_ms(
        [&](int in, const __nv_bfloat16* wm, int out) { return gemm.Run(x, rows, in, wm, out, y).ok(); });
  };
  // The skinny kernel itself (also past the rows Gemm gives it), for the row counts where
  // Gemm takes cuBLASLt.
  auto step_kernel_ms = [&](int rows) {
    return step_gemm_loop_ms([&](int in, const __nv_bfloat16* wm, int out) {
      return cuda::LaunchSkinnyGemm(x, rows, in, wm, out, y, 0.0f, nullptr) == cudaSuccess;
    });
  };
  auto skinny = cuda::Gemm::Create(nullptr, cuda::GemmOptions{.skinny_kernel = true, .skinny_mma_kernel = false});
  auto mma = cuda::Gemm::Create(nullptr, cuda::GemmOptions{.skinny_kernel = true, .skinny_mma_kernel = true});
  auto lt = cuda::Gemm::Create(nullptr, cuda::GemmOptions{.skinny_kernel = false});
  if (!skinny.ok() || !mma.ok() || !lt.ok()) std::exit(1);
  // Alternated, so drift falls on both; the skinny kernel at 1 to 8 rows (decode batches),
  // against cuBLASLt's tensor-core tiles.
  constexpr int kRowCounts = 8;
  float lt_ms[kRowCounts], skinny_ms[kRowCounts], kernel_ms[kRowCounts];
  for (int i = 0; i < kRowCounts; ++i) lt_ms[i] = skinny_ms[i] = kernel_ms[i] = 1e9f;
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < kRowCounts; ++i) {
      lt_ms[i] = std::min(lt_ms[i], step_gemms_ms(**lt, i + 1));
      skinny_ms[i] = std::min(skinny_ms[i], step_gemms_ms(**skinny, i + 1));
      if (i + 1 > cuda::kSkinnyGemmFasterRows) kernel_ms[i] = std::min(kernel_ms[i], step_kernel_ms(i + 1));
    }
  }
  // The tensor-core skinny kernel itself at 5 to 64 rows (a short question's prefill, decode
  // batches; also past the kSkinnyMmaFasterRows that Gemm gives it) against cuBLASLt, alternated.
  const std::vector<int> mma_rows = {5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 20, 24, 32, 40, 48, 64};
  std::vector<float> mma_ms(mma_rows.size(), 1e9f), mma_lt_ms(mma_rows.size(), 1e9f);
  const cuda::SkinnyMmaScratch mma_scratch = (*mma)->mma_scratch();
  for (int round = 0; round < 2; ++round) {
    for (size_t i = 0; i < mma_rows.size(); ++i) {
      mma_lt_ms[i] = std::min(mma_lt_ms[i], step_gemms_ms(**lt, mma_rows[i]));
      mma_ms[i] = std::min(mma_ms[i], step_gemm_loop_ms([&](int in, const __nv_bfloat16* wm, int out) {
                             return cuda::LaunchSkinnyMmaGemm(x, mma_rows[i], in, wm, out, y, 0.0f, mma_scratch,
                                                              nullptr) == cudaSuccess;
                           }));
    }
  }
  // The same launches as one CUDA graph (captured with their dependent-launch edges) against
  // launched one by one, on one stream, alternated: what graphs would take off a decode step's
  // GEMMs (issue 25's decode-step item).
  float graph_ms = 0, launched_ms = 0;
  {
    cudaStream_t gs;
    CHECK_CUDA(cudaStreamCreateWithFlags(&gs, cudaStreamNonBlocking));
    auto g = cuda::Gemm::Create(gs);
    if (!g.ok()) std::exit(1);
    auto run_step = [&] {
      for (int l = 0; l < c.n_layers; ++l) {
        for (size_t i = 0; i < 4; ++i) {
          if (!(*g)->Run(x, 1, static_cast<int>(mats[i].in), w[i], static_cast<int>(mats[i].out), y).ok()) std::exit(1);
        }
      }
      if (!(*g)->Run(x, 1, static_cast<int>(dim), cls, static_cast<int>(vocab), y).ok()) std::exit(1);
    };
    run_step();
    CHECK_CUDA(cudaStreamSynchronize(gs));
    cudaGraph_t graph;
    CHECK_CUDA(cudaStreamBeginCapture(gs, cudaStreamCaptureModeThreadLocal));
    run_step();
    CHECK_CUDA(cudaStreamEndCapture(gs, &graph));
    cudaGraphExec_t exec;
    CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    std::tie(graph_ms, launched_ms) =
        bench::AlternatedMedianMs([&] { CHECK_CUDA(cudaGraphLaunch(exec, gs)); }, run_step, 20, gs);
    CHECK_CUDA(cudaGraphExecDestroy(exec));
    CHECK_CUDA(cudaGraphDestroy(graph));
    CHECK_CUDA(cudaStreamDestroy(gs));
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
  // TTFT with every document cached (issue 25): the same 8 documents, now in the pool, and a
  // 16-token question, one new token; its floor is one pass over the weights.
  std::vector<double> cached_ttft_ms;
  request.prompt.assign(16, 0);
  for (int rep = 0; rep < 11; ++rep) {
    for (int32_t& t : request.prompt) t = static_cast<int32_t>(3 + rng() % (c.vocab_size - 3));
    request.sampling.max_tokens = 1;
    auto result = (*engine)->Generate(request);
    if (!result.ok() || result->usage.cached_documents != 8) std::exit(1);
    cached_ttft_ms.push_back(result->ttft_seconds * 1e3);
  }
  std::sort(cached_ttft_ms.begin(), cached_ttft_ms.end());
  const double weight_pass_ms = weight_bytes / 1e9 / hbm_gbs * 1e3;
  std::printf(
      "TTFT with all 8 documents cached, 16-token question, batch 1: %.2f ms (median of %zu) against one weight pass "
      "%.2f ms: %.2fx\n",
      cached_ttft_ms[cached_ttft_ms.size() / 2], cached_ttft_ms.size(), weight_pass_ms,
      cached_ttft_ms[cached_ttft_ms.size() / 2] / weight_pass_ms);
  if (kernel_trace) {
    constexpr int kTtftReps = 5, kDecodeSteps = 128;
    TraceSteps("the TTFT step (16-token question over 8 cached documents, one new token), batch 1", kTtftReps, [&] {
      for (int rep = 0; rep < kTtftReps; ++rep) {
        if (!(*engine)->Generate(request).ok()) std::exit(1);
      }
    });
    request.sampling.max_tokens = kDecodeSteps + 1;
    TraceSteps("decode steps, batch 1, context ~4.1k (and the request's one cached prefill step)", kDecodeSteps, [&] {
      if (!(*engine)->Generate(request).ok()) std::exit(1);
    });
  }
  std::printf("backend: %s\n", backend.ProfileSummary().c_str());
  std::printf(
      "a step's GEMMs at 1 row as one CUDA graph: %.3f ms against %.3f ms launched one by one on the same stream "
      "(%.3fx)\n",
      graph_ms, launched_ms, launched_ms / graph_ms);
  for (int i = 0; i < kRowCounts; ++i) {
    std::printf(
        "a step's GEMMs at %d row(s): skinny kernel %.3f ms (%.0f GB/s of weights), cuBLASLt %.3f ms (%.0f GB/s): "
        "%.3fx\n",
        i + 1, skinny_ms[i], weight_bytes / 1e9 / (skinny_ms[i] / 1e3), lt_ms[i], weight_bytes / 1e9 / (lt_ms[i] / 1e3),
        lt_ms[i] / skinny_ms[i]);
    if (i + 1 > cuda::kSkinnyGemmFasterRows) {
      std::printf("  the skinny kernel itself at %d rows: %.3f ms (%.0f GB/s), %.3fx cuBLASLt\n", i + 1, kernel_ms[i],
                  weight_bytes / 1e9 / (kernel_ms[i] / 1e3), lt_ms[i] / kernel_ms[i]);
    }
  }
  for (size_t i = 0; i < mma_rows.size(); ++i) {
    std::printf(
        "a step's GEMMs at %d rows: tensor-core skinny kernel %.3f ms (%.0f GB/s of weights), cuBLASLt %.3f ms "
        "(%.0f GB/s): %.3fx\n",
        mma_rows[i], mma_ms[i], weight_bytes / 1e9 / (mma_ms[i] / 1e3), mma_lt_ms[i],
        weight_bytes / 1e9 / (mma_lt_ms[i] / 1e3), mma_lt_ms[i] / mma_ms[i]);
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
      "           [--mixed-steps decode|prefill] [--no-backend-warm-up] [--no-skinny-gemm]\n"
      "           [--no-prefill-pack] [--kernel-trace] [--out FILE.json]\n"
      "Without --e2e-batched: chunk import and decode ceilings, then with --e2e the trace one request\n"
      "at a time (40 requests, 16 tokens, 12 GiB pool). --e2e-batched runs only the loaded benchmark\n"
      "(256 requests, 128 tokens, rate inf, concurrency 64; the pool takes what is left of 0.9 of the\n"
      "GPU's memory after the weights unless --kv-pool-gib says). --kernel-trace: where the TTFT step and\n"
      "a decode step spend their time on the GPU (CUPTI, loaded at run time: $LAZYKV_CUPTI or libcupti.so.13).\n");
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
  bool no_backend_warm_up = false, no_skinny_gemm = false, no_prefill_pack = false, kernel_trace = false;
  parser.AddSwitch("--kernel-trace", &kernel_trace);
  parser.AddSwitch("--no-backend-warm-up", &no_backend_warm_up);
  parser.AddSwitch("--no-skinny-gemm", &no_skinny_gemm);
  parser.AddSwitch("--no-prefill-pack", &no_prefill_pack);
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
  backend_options.pack_prefill_heads = !no_prefill_pack;
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
  const double hbm_gbs = bench::ChunkTransferBench(**backend);
  DecodeBench(**backend, hbm_gbs, backend_options.skinny_gemm, kernel_trace);
  if (e2e) EndToEnd(**backend, requests > 0 ? requests : 40, max_tokens >= 0 ? max_tokens : 16);
  return 0;
}
