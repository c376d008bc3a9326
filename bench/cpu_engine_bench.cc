// CPU engine benchmark: the same RAG requests (documents reused in shuffled orders)
// through each attention mode, with `none` as the baseline of the same run, plus plain
// decode throughput. usage: cpu_engine_bench [--model SPEC] [--docs D] [--doc-tokens L]
//   [--per-request K] [--requests R] [--max-tokens N] [--seed S]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>

#include "absl/strings/numbers.h"
#include "worker/backend/cpu_backend.h"
#include "worker/engine/engine.h"
#include "worker/model/model_loader.h"

namespace lazykv {
namespace {

struct Options {
  std::string model = "synthetic:small";
  int docs = 16, doc_tokens = 256, per_request = 4, requests = 24, max_tokens = 8, prompt_tokens = 16;
  uint64_t seed = 1;
};

struct ModeResult {
  double mean_ttft_ms = 0, p50_ttft_ms = 0, total_s = 0;
  long cached = 0, computed = 0;
  unsigned long long copied = 0;
};

std::unique_ptr<Engine> MakeEngine(const ModelWeights& w, AttentionMode mode) {
  auto backend = CreateCpuBackend(w, 16, 8192);
  if (!backend.ok()) {
    std::fprintf(stderr, "%s\n", backend.status().ToString().c_str());
    std::exit(1);
  }
  return *Engine::Create(*std::move(backend),
                         EngineOptions{.mode = mode, .anchor = {}, .tier = nullptr, .pipeline = {}});
}

ModeResult RunMode(const ModelWeights& w, AttentionMode mode, const std::vector<GenerateRequest>& requests) {
  auto engine = MakeEngine(w, mode);
  ModeResult r;
  std::vector<double> ttft;
  const auto start = std::chrono::steady_clock::now();
  for (const GenerateRequest& request : requests) {
    auto result = engine->Generate(request);
    if (!result.ok()) {
      std::fprintf(stderr, "%s\n", result.status().ToString().c_str());
      std::exit(1);
    }
    ttft.push_back(result->ttft_seconds * 1e3);
    r.cached += result->usage.cached_tokens;
    r.computed += result->usage.computed_tokens;
    r.copied += result->usage.kv_bytes_copied;
  }
  r.total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.mean_ttft_ms = std::accumulate(ttft.begin(), ttft.end(), 0.0) / ttft.size();
  std::nth_element(ttft.begin(), ttft.begin() + ttft.size() / 2, ttft.end());
  r.p50_ttft_ms = ttft[ttft.size() / 2];
  return r;
}

int Main(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    bool ok = true;
    if (flag == "--model")
      o.model = value;
    else if (flag == "--docs")
      ok = absl::SimpleAtoi(value, &o.docs);
    else if (flag == "--doc-tokens")
      ok = absl::SimpleAtoi(value, &o.doc_tokens);
    else if (flag == "--per-request")
      ok = absl::SimpleAtoi(value, &o.per_request);
    else if (flag == "--requests")
      ok = absl::SimpleAtoi(value, &o.requests);
    else if (flag == "--max-tokens")
      ok = absl::SimpleAtoi(value, &o.max_tokens);
    else if (flag == "--seed")
      ok = absl::SimpleAtoi(value, &o.seed);
    else
      ok = false;
    if (!ok) {
      std::fprintf(stderr, "bad flag %s %s\n", flag.c_str(), value.c_str());
      return 2;
    }
  }
  auto weights = LoadModel(o.model);
  if (!weights.ok()) {
    std::fprintf(stderr, "%s\n", weights.status().ToString().c_str());
    return 1;
  }
  const int vocab = weights->config.vocab_size;
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<int32_t> token(3, vocab - 1);
  std::vector<std::vector<int32_t>> corpus(o.docs);
  for (auto& doc : corpus) {
    doc.resize(o.doc_tokens);
    for (auto& t : doc) t = token(rng);
  }
  std::vector<GenerateRequest> requests(o.requests);
  for (auto& r : requests) {
    std::vector<int> order(o.docs);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    for (int k = 0; k < o.per_request; ++k) r.docs.push_back(corpus[order[k]]);
    for (int t = 0; t < o.prompt_tokens; ++t) r.prompt.push_back(token(rng));
    r.sampling.max_tokens = o.max_tokens;
  }
  std::printf("model %s; %d requests, each %d of %d documents (%d tokens) in random order, prompt %d, max_tokens %d\n",
              o.model.c_str(), o.requests, o.per_request, o.docs, o.doc_tokens, o.prompt_tokens, o.max_tokens);
  std::printf("%-7s %12s %12s %10s %10s %12s %14s %12s\n", "mode", "mean_ttft_ms", "p50_ttft_ms", "total_s", "cached",
              "computed", "kv_copied_MiB", "ttft_vs_none");
  ModeResult none;
  for (AttentionMode mode :
       {AttentionMode::kNone, AttentionMode::kPrefix, AttentionMode::kBlock, AttentionMode::kLazy}) {
    const ModeResult r = RunMode(*weights, mode, requests);
    if (mode == AttentionMode::kNone) none = r;
    std::printf("%-7s %12.2f %12.2f %10.2f %10ld %12ld %14.1f %11.2fx\n", std::string(AttentionModeName(mode)).c_str(),
                r.mean_ttft_ms, r.p50_ttft_ms, r.total_s, r.cached, r.computed, r.copied / 1048576.0,
                none.mean_ttft_ms / r.mean_ttft_ms);
  }

  // Decode throughput: one long greedy generation from the anchor.
  auto engine = MakeEngine(*weights, AttentionMode::kLazy);
  GenerateRequest decode;
  decode.sampling.max_tokens = std::min(256, weights->config.max_seq_len - 1);
  auto result = engine->Generate(decode);
  const double decode_s = result->total_seconds - result->ttft_seconds;
  std::printf("decode: %zu tokens in %.3f s after the first: %.0f tokens/s (batch 1, one thread)\n",
              result->tokens.size(), decode_s, (result->tokens.size() - 1) / decode_s);
  return 0;
}

}  // namespace
}  // namespace lazykv

int main(int argc, char** argv) { return lazykv::Main(argc, argv); }
