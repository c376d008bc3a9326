#include "bench/engine_load_report.h"

#include <optional>

#include "absl/strings/str_format.h"
#include "bench/load_report.h"

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
  std::string out = absl::StrFormat("KV pool: %d blocks of %d tokens, %.2f GiB; a worst-case request reserves", blocks,
                                    block_size, static_cast<double>(blocks) * bytes_per_block / (1ull << 30));
  for (size_t i = 0; i < results.size(); ++i) {
    const ModeLoadResult& r = results[i];
    out += absl::StrFormat("%s %s %d blocks (%d fit at once)", i == 0 ? "" : ";", AttentionModeName(r.mode),
                           r.worst_case_blocks, r.worst_case_requests_fit);
  }
  return out + "\n";
}

std::string FormatLoadTable(const std::vector<ModeLoadResult>& results) {
  std::string out = absl::StrFormat("%-7s %9s %9s %9s %8s %10s %13s %13s %13s %9s %11s %11s %6s\n", "mode",
                                    "ttft_mean", "ttft_p50", "ttft_p90", "req/s", "out_tok/s", "running",
                                    "decoding", "queued", "peak_blk", "cached_tok", "computed", "failed");
  out += absl::StrFormat("%-7s %9s %9s %9s %8s %10s %13s %13s %13s %9s %11s %11s %6s\n", "", "ms", "ms", "ms", "", "",
                         "mean/max", "mean/max", "mean/max", "used", "", "", "");
  for (const ModeLoadResult& r : results) {
    out += absl::StrFormat("%-7s %9.1f %9.1f %9.1f %8.2f %10.1f %8.1f/%-4d %8.1f/%-4d %8.1f/%-4d %9d %11d %11d %6d\n",
                           AttentionModeName(r.mode), r.ttft_ms.mean, r.ttft_ms.p50, r.ttft_ms.p90,
                           r.request_throughput, r.output_throughput, r.mean_running, r.max_running, r.mean_decoding,
                           r.max_decoding, r.mean_queued, r.max_queued, r.peak_blocks_used, r.cached_tokens,
                           r.computed_tokens, r.failed);
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

json ToJson(const ModeLoadResult& r) {
  return {{"mode", AttentionModeName(r.mode)},
          {"requests", r.requests},
          {"completed", r.completed},
          {"failed", r.failed},
          {"first_error", r.first_error},
          {"duration_s", r.duration_s},
          {"ttft_ms", ToJson(r.ttft_ms)},
          {"queue_ms", ToJson(r.queue_ms)},
          {"request_throughput", r.request_throughput},
          {"output_token_throughput", r.output_throughput},
          {"output_tokens", r.output_tokens},
          {"steps", r.steps},
          {"running", {{"mean", r.mean_running}, {"max", r.max_running}}},
          {"decoding", {{"mean", r.mean_decoding}, {"max", r.max_decoding}}},
          {"queued", {{"mean", r.mean_queued}, {"max", r.max_queued}}},
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
