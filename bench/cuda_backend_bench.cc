// The CUDA backend with synthetic:llama3-8b (weights drawn on the GPU):
//  1. ceilings in the same run: pinned host -> device cudaMemcpy of a chunk's bytes, and a
//     large device -> device copy;
//  2. ImportChunk of a fetched 512-token chunk (32 layers, 8 KV heads, head dim 128, bf16,
//     16-token blocks: 64 MiB) from pinned host RAM into pool blocks, GB/s against the
//     pinned cudaMemcpy of the same bytes (floor 80%); from pageable memory and ExportChunk
//     for information;
//  3. with --e2e: a Zipf RAG trace (bench/rag_trace.h) through a fresh engine per mode over
//     the one backend, TTFT and throughput per mode.
// usage: cuda_backend_bench [--e2e] [--requests N] [--max-tokens N] [--kv-pool-gib G]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench/cuda_bench_util.h"
#include "bench/rag_trace.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/model_ops.h"
#include "worker/cuda_backend.h"
#include "worker/engine.h"
#include "worker/synthetic_model.h"

namespace lazykv {
namespace {

// Lets a fresh engine (fresh allocator and chunk index) run on a backend that outlives it.
class BorrowedBackend : public Backend {
 public:
  explicit BorrowedBackend(Backend* b) : b_(b) {}
  const ModelConfig& config() const override { return b_->config(); }
  std::string kv_dtype() const override { return b_->kv_dtype(); }
  int block_size() const override { return b_->block_size(); }
  int num_blocks() const override { return b_->num_blocks(); }
  uint64_t kv_bytes_per_block() const override { return b_->kv_bytes_per_block(); }
  Hash128 model_fingerprint() const override { return b_->model_fingerprint(); }
  absl::Status Forward(std::span<const SequenceStep> s, std::vector<std::vector<float>>* l) override {
    return b_->Forward(s, l);
  }
  absl::Status CopyBlocksRotated(std::span<const BlockCopy> c) override { return b_->CopyBlocksRotated(c); }
  absl::Status ExportChunk(std::span<const KvBlockRef> b, std::string* p) override { return b_->ExportChunk(b, p); }
  absl::Status ImportChunk(std::string_view p, std::span<const KvBlockRef> b) override {
    return b_->ImportChunk(p, b);
  }

 private:
  Backend* b_;
};

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
  const double memcpy_s = MedianSeconds(
      [&] { CHECK_CUDA(cudaMemcpy(device, pinned, bytes, cudaMemcpyHostToDevice)); }, 30);
  auto import = [&](std::string_view payload) {
    const absl::Status s = backend.ImportChunk(payload, blocks);
    if (!s.ok()) {
      std::fprintf(stderr, "ImportChunk: %s\n", std::string(s.message()).c_str());
      std::exit(1);
    }
  };
  const double import_s = MedianSeconds([&] { import(std::string_view(pinned, bytes)); }, 30);
  const double memcpy2_s = MedianSeconds(
      [&] { CHECK_CUDA(cudaMemcpy(device, pinned, bytes, cudaMemcpyHostToDevice)); }, 30);
  const double pageable_s = MedianSeconds([&] { import(pageable); }, 10);
  std::string exported;
  const double export_s = MedianSeconds([&] {
    if (!backend.ExportChunk(blocks, &exported).ok()) std::exit(1);
  }, 10);
  const bool same = exported.size() == bytes && std::memcmp(exported.data(), pinned, bytes) == 0;
  // Device-to-device ceiling: 1 GiB copy, bytes read plus written.
  const size_t big = 1ull << 30;
  void *a = nullptr, *b = nullptr;
  CHECK_CUDA(cudaMalloc(&a, big));
  CHECK_CUDA(cudaMalloc(&b, big));
  CHECK_CUDA(cudaMemset(a, 1, big));
  const double d2d_s = MedianSeconds([&] {
    CHECK_CUDA(cudaMemcpy(b, a, big, cudaMemcpyDeviceToDevice));
    CHECK_CUDA(cudaDeviceSynchronize());
  }, 20);
  const double gb = bytes / 1e9;
  const double memcpy_best = std::min(memcpy_s, memcpy2_s);
  std::printf("ceiling: device-to-device copy %.0f GB/s (read + write, 1 GiB)\n", 2 * big / 1e9 / d2d_s);
  std::printf("chunk: %d tokens, %d layers, %d KV heads, head dim %d, bf16, %d-token blocks: %.1f MiB in %zu blocks\n",
              tokens, c.n_layers, c.n_kv_heads, c.head_dim, bs, bytes / 1048576.0, blocks.size());
  std::printf("pinned cudaMemcpy H2D      %8.3f ms %7.2f GB/s (before), %7.2f GB/s (after)\n", memcpy_s * 1e3,
              gb / memcpy_s, gb / memcpy2_s);
  std::printf("ImportChunk (pinned)       %8.3f ms %7.2f GB/s = %.1f%% of the best pinned memcpy (floor 80%%)\n",
              import_s * 1e3, gb / import_s, 100.0 * memcpy_best / import_s);
  std::printf("ImportChunk (pageable)     %8.3f ms %7.2f GB/s\n", pageable_s * 1e3, gb / pageable_s);
  std::printf("ExportChunk (to a string)  %8.3f ms %7.2f GB/s; round trip %s\n", export_s * 1e3, gb / export_s,
              same ? "exact" : "DIFFERS");
  cudaFree(a);
  cudaFree(b);
  cudaFree(device);
  cudaFreeHost(pinned);
  return 2 * big / 1e9 / d2d_s;  // HBM traffic rate of the copy (read + write)
}

// Where a batch-1 decode step's time goes: the step through the engine (context of about
// 4k tokens) against its GEMMs alone (one layer's matrices, random, run n_layers times, plus
// the classifier; one layer's weights exceed the L2, so this streams from HBM) and against
// streaming every weight once at the HBM rate of the device-to-device copy.
void DecodeBench(Backend& backend, double hbm_gbs) {
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
  CHECK_CUDA(cudaMalloc(&x, 2 * hidden * 2));
  CHECK_CUDA(cuda::LaunchSyntheticFill(10, 2 * hidden, 1.0f, false, x, nullptr, nullptr));
  CHECK_CUDA(cudaMalloc(&y, std::max<size_t>(2 * hidden, vocab) * 4));
  auto gemm = cuda::Gemm::Create(nullptr);
  if (!gemm.ok()) std::exit(1);
  const float gemm_ms = bench::MedianMs([&] {
    for (int l = 0; l < c.n_layers; ++l) {
      for (size_t i = 0; i < 4; ++i) {
        if (!(*gemm)->Run(x, 1, static_cast<int>(mats[i].in), w[i], static_cast<int>(mats[i].out), y).ok()) std::exit(1);
      }
    }
    if (!(*gemm)->Run(x, 1, static_cast<int>(dim), cls, static_cast<int>(vocab), y).ok()) std::exit(1);
  }, 20);
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
  std::printf("\ndecode step, batch 1, context ~4.1k: %.2f ms through the engine; its GEMMs alone %.2f ms "
              "(%.0f GB/s of weights); streaming %.2f GB of weights at the copy's HBM rate (read + write) %.2f ms\n",
              step_ms, gemm_ms, weight_bytes / 1e9 / (gemm_ms / 1e3), weight_bytes / 1e9,
              weight_bytes / 1e9 / hbm_gbs * 1e3);
}

void EndToEnd(Backend& backend, int num_requests, int max_tokens) {
  TraceOptions options;
  options.num_docs = 100;
  options.docs_per_request = 8;
  options.zipf_s = 1.1;
  options.num_requests = num_requests;
  options.doc_lengths = "fixed:512";
  options.max_tokens = max_tokens;
  options.vocab_size = backend.config().vocab_size;
  auto trace = GenerateTrace(options);
  if (!trace.ok()) {
    std::fprintf(stderr, "trace: %s\n", std::string(trace.status().message()).c_str());
    std::exit(1);
  }
  std::printf("\nend to end: synthetic:llama3-8b, Zipf trace (100 documents of 512 tokens, 8 per request, s = 1.1, "
              "%d requests, %d new tokens each), closed loop, one engine per mode over one backend\n",
              num_requests, max_tokens);
  std::printf("%-7s %12s %12s %12s %10s %10s %10s %12s\n", "mode", "mean_ttft_ms", "p50_ttft_ms", "p90_ttft_ms",
              "req_per_s", "tok_per_s", "cached", "computed");
  for (AttentionMode mode : {AttentionMode::kNone, AttentionMode::kPrefix, AttentionMode::kBlock,
                             AttentionMode::kLazy}) {
    EngineOptions engine_options;
    engine_options.mode = mode;
    auto engine = Engine::Create(std::make_unique<BorrowedBackend>(&backend), engine_options);
    if (!engine.ok()) std::exit(1);
    std::vector<double> ttft;
    long cached = 0, computed = 0, generated = 0;
    const auto start = std::chrono::steady_clock::now();
    for (const TraceRequest& r : trace->requests) {
      GenerateRequest request;
      for (int d : r.doc_ids) request.docs.push_back(trace->documents[d]);
      request.prompt = r.question;
      request.sampling.max_tokens = r.max_tokens;
      auto result = (*engine)->Generate(request);
      if (!result.ok()) {
        std::fprintf(stderr, "%s: %s\n", std::string(AttentionModeName(mode)).c_str(), std::string(result.status().message()).c_str());
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
    std::printf("%-7s %12.2f %12.2f %12.2f %10.2f %10.1f %10ld %12ld\n", std::string(AttentionModeName(mode)).c_str(), mean,
                ttft[ttft.size() / 2], ttft[ttft.size() * 9 / 10], ttft.size() / total, generated / total, cached,
                computed);
  }
}

}  // namespace
}  // namespace lazykv

int main(int argc, char** argv) {
  bool e2e = false;
  int requests = 40, max_tokens = 16;
  double pool_gib = 12;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--e2e") e2e = true;
    if (a == "--requests" && i + 1 < argc) requests = std::atoi(argv[++i]);
    if (a == "--max-tokens" && i + 1 < argc) max_tokens = std::atoi(argv[++i]);
    if (a == "--kv-pool-gib" && i + 1 < argc) pool_gib = std::atof(argv[++i]);
  }
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("GPU: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  const lazykv::ModelConfig config = *lazykv::SyntheticConfig("llama3-8b");
  const int blocks = static_cast<int>(pool_gib * 1073741824.0 / lazykv::CudaKvBytesPerBlock(config, 16));
  const auto start = std::chrono::steady_clock::now();
  auto backend = lazykv::CreateSyntheticCudaBackend(config, 0, 16, blocks);
  if (!backend.ok()) {
    std::fprintf(stderr, "backend: %s\n", std::string(backend.status().message()).c_str());
    return 1;
  }
  std::printf("synthetic:llama3-8b drawn on the GPU in %.2f s; KV pool %d blocks\n", lazykv::Seconds(start), blocks);
  const double hbm_gbs = lazykv::ScatterBench(**backend);
  lazykv::DecodeBench(**backend, hbm_gbs);
  if (e2e) lazykv::EndToEnd(**backend, requests, max_tokens);
  return 0;
}
