#include "bench/engine_load_report.h"

#include <chrono>
#include <cstdio>
#include <fstream>
#include <optional>
#include <random>

#include "absl/strings/str_format.h"
#include "bench/load_report.h"
#include "worker/backend/sampler.h"

namespace lazykv {
namespace {

using nlohmann::json;

const ModeLoadResult* FindMode(const std::vector<ModeLoadResult>& results, AttentionMode mode) {
  for (const ModeLoadResult& r : results) {
    if (r.mode == mode) return &r;
  }
  return nullptr;
}

double Ratio(double a, double b) { return b > 0 ? a / b : 0; }

struct LazyOverBlock {
  double ttft_mean_lower = 0, ttft_p50_lower = 0, request_throughput = 0, output_throughput = 0;
};

// Nothing when either mode is missing.
std::optional<LazyOverBlock> CompareLazyBlock(const std::vector<ModeLoadResult>& results) {
  const ModeLoadResult* lazy = FindMode(results, AttentionMode::kLazy);
  const ModeLoadResult* block = FindMode(results, AttentionMode::kBlock);
  if (lazy == nullptr || block == nullptr) return std::nullopt;
  return LazyOverBlock{.ttft_mean_lower = Ratio(block->ttft_ms.mean, lazy->ttft_ms.mean),
                       .ttft_p50_lower = Ratio(block->ttft_ms.p50, lazy->ttft_ms.p50),
                       .request_throughput = Ratio(lazy->request_throughput, block->request_throughput),
                       .output_throughput = Ratio(lazy->output_throughput, block->output_throughput)};
}

}  // namespace

std::string FormatLoadCapacity(const std::vector<ModeLoadResult>& results, int block_size, uint64_t bytes_per_block) {
  if (results.empty()) return "";
  const int blocks = results.front().num_blocks;
  std::string out = absl::StrFormat("KV pool: %d blocks of %d tokens, %.2f GiB; a worst-case request alone reserves",
                                    blocks, block_size, static_cast<double>(blocks) * bytes_per_block / (1ull << 30));
  for (size_t i = 0; i < results.size(); ++i) {
    const ModeLoadResult& r = results[i];
    out += absl::StrFormat("%s %s %d blocks (%d fit at once sharing nothing)", i == 0 ? "" : ";",
                           AttentionModeName(r.mode), r.worst_case_blocks, r.worst_case_requests_fit);
  }
  return out + "; lazy and block reserve a shared document once for all the requests running with it\n";
}

std::string FormatLoadTableHeader() {
  std::string out = absl::StrFormat("%-7s %9s %9s %9s %8s %10s %13s %13s %13s %9s %11s %11s %6s\n", "mode", "ttft_mean",
                                    "ttft_p50", "ttft_p90", "req/s", "out_tok/s", "running", "decoding", "queued",
                                    "peak_blk", "cached_tok", "computed", "failed");
  out += absl::StrFormat("%-7s %9s %9s %9s %8s %10s %13s %13s %13s %9s %11s %11s %6s\n", "", "ms", "ms", "ms", "", "",
                         "mean/max", "mean/max", "mean/max", "used", "", "", "");
  return out;
}

std::string FormatLoadRow(const ModeLoadResult& r) {
  return absl::StrFormat("%-7s %9.1f %9.1f %9.1f %8.2f %10.1f %8.1f/%-4d %8.1f/%-4d %8.1f/%-4d %9d %11d %11d %6d\n",
                         AttentionModeName(r.mode), r.ttft_ms.mean, r.ttft_ms.p50, r.ttft_ms.p90, r.request_throughput,
                         r.output_throughput, r.mean_running, r.max_running, r.mean_decoding, r.max_decoding,
                         r.mean_queued, r.max_queued, r.peak_blocks_used, r.cached_tokens, r.computed_tokens, r.failed);
}

std::string FormatLoadTable(const std::vector<ModeLoadResult>& results) {
  std::string out = FormatLoadTableHeader();
  for (const ModeLoadResult& r : results) out += FormatLoadRow(r);
  return out;
}

std::string FormatTtftByCachedTable(const std::vector<ModeLoadResult>& results) {
  std::string out = "TTFT p50 by the number of a request's documents found cached, ms (requests):\n";
  for (const ModeLoadResult& r : results) {
    out += absl::StrFormat("%-7s", AttentionModeName(r.mode));
    for (const auto& [cached, d] : r.ttft_ms_by_cached_documents) {
      out += absl::StrFormat(" %d: %.1f (%d)", cached, d.p50, d.count);
    }
    out += "\n";
  }
  return out;
}

std::string FormatStepTable(const std::vector<ModeLoadResult>& results) {
  std::string out = absl::StrFormat("%-7s %8s %10s %13s %12s %14s %13s\n", "mode", "steps", "step_ms", "decode_steps",
                                    "decode_batch", "decode_step_ms", "ms_per_token");
  for (const ModeLoadResult& r : results) {
    out += absl::StrFormat("%-7s %8d %10.2f %13d %12.1f %14.2f %13.3f\n", AttentionModeName(r.mode), r.steps,
                           r.mean_step_ms, r.decode_steps, r.decode_step_batch, r.decode_step_ms,
                           r.decode_step_batch > 0 ? r.decode_step_ms / r.decode_step_batch : 0.0);
  }
  return out;
}

std::string FormatLazyBlockRatios(const std::vector<ModeLoadResult>& results) {
  const std::optional<LazyOverBlock> ratio = CompareLazyBlock(results);
  if (!ratio) return "";
  return absl::StrFormat(
      "lazy over block: mean TTFT %.2fx lower (p50 %.2fx), request throughput %.2fx, output tokens/s %.2fx\n",
      ratio->ttft_mean_lower, ratio->ttft_p50_lower, ratio->request_throughput, ratio->output_throughput);
}

double HostGreedySampleMs(int vocab_size) {
  std::vector<float> logits(vocab_size);
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (float& l : logits) l = normal(rng);
  SamplerRng sampler_rng(1);
  const SamplingParams greedy;
  int64_t sink = 0;
  constexpr int kReps = 100;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kReps; ++i) sink += SampleToken(logits, greedy, sampler_rng).id;
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() / kReps;
  return sink >= 0 ? ms : -ms;  // uses the tokens, so the loop stays
}

absl::Status RunModesAndReport(Backend& backend, const RagTrace& trace, const std::vector<AttentionMode>& modes,
                               const LoadOptions& options, json setup, const std::string& json_path) {
  const double sample_ms = HostGreedySampleMs(backend.config().vocab_size);
  setup["host_greedy_sample_ms"] = sample_ms;
  std::printf("host greedy sampling of one %d-token row of logits: %.3f ms\n%s", backend.config().vocab_size, sample_ms,
              FormatLoadTableHeader().c_str());
  std::fflush(stdout);
  std::vector<ModeLoadResult> done;
  bool written = true;
  auto on_mode_done = [&](const ModeLoadResult& r) {
    std::printf("%s", FormatLoadRow(r).c_str());
    std::fflush(stdout);
    done.push_back(r);
    std::ofstream file(json_path);
    file << LoadRunToJson(done, setup).dump(1) << "\n";
    written = written && static_cast<bool>(file);
  };
  auto results = RunModesUnderLoad(backend, trace, modes, options, on_mode_done);
  if (!results.ok()) return results.status();
  std::printf("\n%s%s\n%s%s%s",
              FormatLoadCapacity(*results, backend.block_size(), backend.kv_bytes_per_block()).c_str(),
              FormatLoadTable(*results).c_str(), FormatTtftByCachedTable(*results).c_str(),
              FormatStepTable(*results).c_str(), FormatLazyBlockRatios(*results).c_str());
  if (!written) return absl::UnavailableError(absl::StrFormat("cannot write %s", json_path));
  std::printf("JSON: %s\n", json_path.c_str());
  return absl::OkStatus();
}

json TtftByCachedToJson(const ModeLoadResult& r) {
  json by = json::object();
  for (const auto& [cached, d] : r.ttft_ms_by_cached_documents) by[std::to_string(cached)] = ToJson(d);
  return by;
}

json ToJson(const ModeLoadResult& r) {
  return {{"mode", AttentionModeName(r.mode)},
          {"requests", r.requests},
          {"completed", r.completed},
          {"failed", r.failed},
          {"first_error", r.first_error},
          {"duration_s", r.duration_s},
          {"ttft_ms", ToJson(r.ttft_ms)},
          {"ttft_ms_by_cached_documents", TtftByCachedToJson(r)},
          {"queue_ms", ToJson(r.queue_ms)},
          {"request_throughput", r.request_throughput},
          {"output_token_throughput", r.output_throughput},
          {"output_tokens", r.output_tokens},
          {"steps", r.steps},
          {"running", {{"mean", r.mean_running}, {"max", r.max_running}}},
          {"decoding", {{"mean", r.mean_decoding}, {"max", r.max_decoding}}},
          {"queued", {{"mean", r.mean_queued}, {"max", r.max_queued}}},
          {"mean_step_ms", r.mean_step_ms},
          {"decode_only_steps",
           {{"count", r.decode_steps}, {"mean_batch", r.decode_step_batch}, {"mean_ms", r.decode_step_ms}}},
          {"num_blocks", r.num_blocks},
          {"peak_blocks_used", r.peak_blocks_used},
          {"peak_blocks_reserved", r.peak_blocks_reserved},
          {"evictions", r.evictions},
          {"worst_case_blocks", r.worst_case_blocks},
          {"worst_case_requests_fit", r.worst_case_requests_fit},
          {"prompt_tokens", r.prompt_tokens},
          {"cached_tokens", r.cached_tokens},
          {"computed_tokens", r.computed_tokens},
          {"kv_bytes_copied", r.kv_bytes_copied}};
}

json LoadRunToJson(const std::vector<ModeLoadResult>& results, const json& setup) {
  json out = {{"setup", setup}, {"modes", json::array()}};
  for (const ModeLoadResult& r : results) out["modes"].push_back(ToJson(r));
  if (const std::optional<LazyOverBlock> ratio = CompareLazyBlock(results)) {
    out["lazy_over_block"] = {{"ttft_mean_lower", ratio->ttft_mean_lower},
                              {"ttft_p50_lower", ratio->ttft_p50_lower},
                              {"request_throughput", ratio->request_throughput},
                              {"output_token_throughput", ratio->output_throughput}};
  }
  return out;
}

}  // namespace lazykv
