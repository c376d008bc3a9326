#include "bench/load_report.h"

#include "absl/strings/str_format.h"
#include "common/byte_size.h"

namespace lazykv {

using nlohmann::json;

json ToJson(const Distribution& d) {
  return {{"count", d.count}, {"mean", d.mean}, {"p50", d.p50}, {"p90", d.p90}, {"p99", d.p99}, {"max", d.max}};
}

json ToJson(const UsageCounts& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"pool_tokens", u.pool_tokens},
          {"host_tokens", u.host_tokens},
          {"disk_tokens", u.disk_tokens},
          {"remote_tokens", u.remote_tokens},
          {"computed_tokens", u.computed_tokens},
          {"document_tokens", u.document_tokens},
          {"document_cached_tokens", u.document_cached_tokens},
          {"document_computed_tokens", u.document_computed_tokens},
          {"chunk_hits", u.chunk_hits},
          {"cached_documents", u.cached_documents},
          {"chunk_misses", u.chunk_misses},
          {"chunk_recomputes", u.chunk_recomputes},
          {"recomputed_tokens", u.recomputed_tokens},
          {"kv_bytes_copied", u.kv_bytes_copied},
          {"kv_bytes_fetched", u.kv_bytes_fetched},
          {"host_bytes_fetched", u.host_bytes_fetched},
          {"disk_bytes_fetched", u.disk_bytes_fetched},
          {"remote_bytes_fetched", u.remote_bytes_fetched}};
}

json ToJson(const RequestResult& r) {
  json j = {{"id", r.id},
            {"status", r.status},
            {"scheduled_s", r.scheduled_s},
            {"sent_s", r.sent_s},
            {"ttft_ms", r.ttft_ms},
            {"total_ms", r.total_ms},
            {"itl_ms", r.itl_ms},
            {"tokens_received", r.tokens_received},
            {"output_tokens", r.output_tokens}};
  if (!r.ok()) {
    j["error"] = r.error;
    return j;
  }
  j["finish_reason"] = r.finish_reason;
  j["mode"] = r.mode;
  j["usage"] = ToJson(r.usage);
  j["server"] = {{"queue_ms", r.server_queue_ms},
                 {"ttft_ms", r.server_ttft_ms},
                 {"total_ms", r.server_total_ms},
                 {"arrival_monotonic_ns", r.server_arrival_monotonic_ns},
                 {"first_token_in_handler_monotonic_ns", r.server_first_in_handler_monotonic_ns},
                 {"first_write_monotonic_ns", r.server_first_write_monotonic_ns}};
  j["sent_monotonic_ns"] = r.sent_monotonic_ns;
  j["first_read_monotonic_ns"] = r.first_read_monotonic_ns;
  return j;
}

json TtftByCachedToJson(const LoadSummary& s) {
  json by = json::object();
  for (const auto& [cached, d] : s.ttft_ms_by_cached_documents) by[std::to_string(cached)] = ToJson(d);
  return by;
}

// "k: p50 ms (n)" per number of cached documents.
std::string FormatTtftByCached(const LoadSummary& s) {
  std::string out;
  for (const auto& [cached, d] : s.ttft_ms_by_cached_documents) {
    out += absl::StrFormat(" %d: %.1f (%d)", cached, d.p50, d.count);
  }
  return out;
}

json ToJson(const LoadSummary& s) {
  return {{"requests", s.requests},
          {"succeeded", s.succeeded},
          {"errors", s.errors},
          {"modes_served", s.modes_served},
          {"wall_s", s.wall_s},
          {"request_throughput", s.request_throughput},
          {"output_token_throughput", s.output_token_throughput},
          {"ttft_ms", ToJson(s.ttft_ms)},
          {"ttft_ms_by_cached_documents", TtftByCachedToJson(s)},
          {"itl_ms", ToJson(s.itl_ms)},
          {"total_ms", ToJson(s.total_ms)},
          {"server_queue_ms", ToJson(s.server_queue_ms)},
          {"server_ttft_ms", ToJson(s.server_ttft_ms)},
          {"server_total_ms", ToJson(s.server_total_ms)},
          {"usage", ToJson(s.usage)},
          {"hit_ratio", s.hit_ratio},
          {"distinct_document_tokens", s.distinct_document_tokens},
          {"fleet_compute", s.fleet_compute}};
}

json RunToJson(const LoadSummary& summary, const std::vector<RequestResult>& results) {
  json requests = json::array();
  for (const RequestResult& r : results) requests.push_back(ToJson(r));
  return {{"summary", ToJson(summary)}, {"requests", std::move(requests)}};
}

std::string FormatLoadTable(const LoadSummary& s) {
  std::string out = absl::StrFormat("%d requests: %d ok, %d failed, in %.2f s\n", s.requests, s.succeeded,
                                    s.requests - s.succeeded, s.wall_s);
  out += absl::StrFormat("%-16s %10s %10s %10s %10s %7s\n", "latency (ms)", "p50", "p90", "p99", "mean", "n");
  const auto row = [&](const char* name, const Distribution& d) {
    out += absl::StrFormat("%-16s %10.2f %10.2f %10.2f %10.2f %7d\n", name, d.p50, d.p90, d.p99, d.mean, d.count);
  };
  row("TTFT", s.ttft_ms);
  row("ITL", s.itl_ms);
  row("total", s.total_ms);
  row("server TTFT", s.server_ttft_ms);
  row("server queue", s.server_queue_ms);
  out += absl::StrFormat("%-16s%s\n", "TTFT p50 by cached documents (n)", FormatTtftByCached(s));
  out += absl::StrFormat("%-16s %.2f req/s, %.1f output tok/s\n", "throughput", s.request_throughput,
                         s.output_token_throughput);
  out += absl::StrFormat("%-16s %.4f (%d of %d document tokens from cache)\n", "hit ratio", s.hit_ratio,
                         s.usage.document_cached_tokens, s.usage.document_tokens);
  out += absl::StrFormat("%-16s %.4f (%d document tokens prefilled, %d distinct)\n", "fleet compute", s.fleet_compute,
                         s.usage.document_computed_tokens, s.distinct_document_tokens);
  out += absl::StrFormat(
      "%-16s %d chunks, %d tokens (the tier held them; recomputing was judged faster or the "
      "fetch failed; part of fleet compute, not misses)\n",
      "recomputed", s.usage.chunk_recomputes, s.usage.recomputed_tokens);
  out +=
      absl::StrFormat("%-16s pool %d, host %d, disk %d, remote %d, computed %d\n", "prompt tokens", s.usage.pool_tokens,
                      s.usage.host_tokens, s.usage.disk_tokens, s.usage.remote_tokens, s.usage.computed_tokens);
  out += absl::StrFormat("%-16s copied %s, fetched %s (host %s, disk %s, remote %s)\n", "KV bytes",
                         FormatByteSize(s.usage.kv_bytes_copied), FormatByteSize(s.usage.kv_bytes_fetched),
                         FormatByteSize(s.usage.host_bytes_fetched), FormatByteSize(s.usage.disk_bytes_fetched),
                         FormatByteSize(s.usage.remote_bytes_fetched));
  if (!s.modes_served.empty()) {
    out += absl::StrFormat("%-16s", "modes served");
    for (const auto& [mode, n] : s.modes_served) out += absl::StrFormat(" %s %d", mode.empty() ? "?" : mode, n);
    out += "\n";
  }
  for (const auto& [code, n] : s.errors) out += absl::StrFormat("%-16s %s %d\n", "errors", code, n);
  return out;
}

std::string FormatCompareTable(const std::vector<std::pair<std::string, LoadSummary>>& rows) {
  std::string out =
      absl::StrFormat("%-7s %9s %9s %9s %8s %7s %8s %6s %7s %9s %10s %6s\n", "mode", "TTFT p50", "TTFT p90", "TTFT p99",
                      "ITL p50", "req/s", "tok/s", "hit", "fleet", "computed", "KV copied", "errors");
  for (const auto& [mode, s] : rows) {
    out += absl::StrFormat("%-7s %9.2f %9.2f %9.2f %8.2f %7.2f %8.1f %6.3f %7.3f %9d %10s %6d\n", mode, s.ttft_ms.p50,
                           s.ttft_ms.p90, s.ttft_ms.p99, s.itl_ms.p50, s.request_throughput, s.output_token_throughput,
                           s.hit_ratio, s.fleet_compute, s.usage.computed_tokens,
                           FormatByteSize(s.usage.kv_bytes_copied), s.requests - s.succeeded);
  }
  out += "TTFT p50 by the number of a request's documents found cached, ms (requests):\n";
  for (const auto& [mode, s] : rows) out += absl::StrFormat("%-7s%s\n", mode, FormatTtftByCached(s));
  out +=
      "(latencies in ms; hit: document tokens from cache / requested; fleet: document tokens prefilled / "
      "distinct; computed: prompt tokens prefilled)\n";
  return out;
}

}  // namespace lazykv
