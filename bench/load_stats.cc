#include "bench/load_stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

namespace lazykv {
namespace {

// Linear interpolation at rank (n - 1) * q / 100 of values already sorted.
double SortedPercentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const double rank = (sorted.size() - 1) * std::clamp(q, 0.0, 100.0) / 100;
  const size_t lo = static_cast<size_t>(std::floor(rank));
  if (lo + 1 >= sorted.size()) return sorted.back();
  return sorted[lo] + (rank - lo) * (sorted[lo + 1] - sorted[lo]);
}

}  // namespace

double Percentile(std::vector<double> values, double q) {
  std::sort(values.begin(), values.end());
  return SortedPercentile(values, q);
}

Distribution Summarize(const std::vector<double>& values) {
  Distribution d;
  if (values.empty()) return d;
  std::vector<double> sorted = values;
  std::sort(sorted.begin(), sorted.end());
  d.count = static_cast<int64_t>(sorted.size());
  d.mean = std::accumulate(sorted.begin(), sorted.end(), 0.0) / sorted.size();
  d.p50 = SortedPercentile(sorted, 50);
  d.p90 = SortedPercentile(sorted, 90);
  d.p99 = SortedPercentile(sorted, 99);
  d.max = sorted.back();
  return d;
}

UsageCounts& UsageCounts::operator+=(const UsageCounts& o) {
  prompt_tokens += o.prompt_tokens;
  completion_tokens += o.completion_tokens;
  pool_tokens += o.pool_tokens;
  host_tokens += o.host_tokens;
  disk_tokens += o.disk_tokens;
  remote_tokens += o.remote_tokens;
  computed_tokens += o.computed_tokens;
  document_tokens += o.document_tokens;
  document_cached_tokens += o.document_cached_tokens;
  document_computed_tokens += o.document_computed_tokens;
  chunk_hits += o.chunk_hits;
  cached_documents += o.cached_documents;
  chunk_misses += o.chunk_misses;
  chunk_recomputes += o.chunk_recomputes;
  recomputed_tokens += o.recomputed_tokens;
  kv_bytes_copied += o.kv_bytes_copied;
  kv_bytes_fetched += o.kv_bytes_fetched;
  host_bytes_fetched += o.host_bytes_fetched;
  disk_bytes_fetched += o.disk_bytes_fetched;
  remote_bytes_fetched += o.remote_bytes_fetched;
  return *this;
}

int64_t DistinctDocumentTokens(const RagTrace& trace) {
  std::set<int> used;
  for (const TraceRequest& r : trace.requests) used.insert(r.doc_ids.begin(), r.doc_ids.end());
  // Two documents with the same tokens are one chunk to the worker.
  std::set<std::vector<int32_t>> contents;
  int64_t tokens = 0;
  for (int d : used) {
    if (contents.insert(trace.documents[d]).second) tokens += static_cast<int64_t>(trace.documents[d].size());
  }
  return tokens;
}

LoadSummary SummarizeRun(const std::vector<RequestResult>& results, double wall_s, int64_t distinct_document_tokens) {
  LoadSummary s;
  s.requests = static_cast<int64_t>(results.size());
  s.wall_s = wall_s;
  s.distinct_document_tokens = distinct_document_tokens;
  std::vector<double> ttft, itl, total, queue, server_ttft, server_total;
  std::map<int64_t, std::vector<double>> ttft_by_cached;
  for (const RequestResult& r : results) {
    if (!r.ok()) {
      ++s.errors[r.status];
      continue;
    }
    ++s.succeeded;
    ++s.modes_served[r.mode];
    s.usage += r.usage;
    if (r.ttft_ms >= 0) {
      ttft.push_back(r.ttft_ms);
      ttft_by_cached[r.usage.cached_documents].push_back(r.ttft_ms);
    }
    itl.insert(itl.end(), r.itl_ms.begin(), r.itl_ms.end());
    total.push_back(r.total_ms);
    queue.push_back(r.server_queue_ms);
    server_ttft.push_back(r.server_ttft_ms);
    server_total.push_back(r.server_total_ms);
  }
  s.ttft_ms = Summarize(ttft);
  for (const auto& [cached, values] : ttft_by_cached) s.ttft_ms_by_cached_documents[cached] = Summarize(values);
  s.itl_ms = Summarize(itl);
  s.total_ms = Summarize(total);
  s.server_queue_ms = Summarize(queue);
  s.server_ttft_ms = Summarize(server_ttft);
  s.server_total_ms = Summarize(server_total);
  if (wall_s > 0) {
    s.request_throughput = s.succeeded / wall_s;
    s.output_token_throughput = s.usage.completion_tokens / wall_s;
  }
  if (s.usage.document_tokens > 0) {
    s.hit_ratio = static_cast<double>(s.usage.document_cached_tokens) / s.usage.document_tokens;
  }
  if (distinct_document_tokens > 0) {
    s.fleet_compute = static_cast<double>(s.usage.document_computed_tokens) / distinct_document_tokens;
  }
  return s;
}

}  // namespace lazykv
