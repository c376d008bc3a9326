// The load test's statistics (issue 4): what one replayed request measured, and the
// aggregation of a run into percentiles, throughputs, the hit ratio and fleet compute.
// Plain data with no gRPC in it, so the arithmetic is unit-tested on its own.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "bench/rag_trace.h"

namespace lazykv {

// The q-th percentile (0 <= q <= 100) by linear interpolation between the closest ranks
// (numpy's default); 0 for no values.
double Percentile(std::vector<double> values, double q);

struct Distribution {
  int64_t count = 0;
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, max = 0;
};
Distribution Summarize(const std::vector<double>& values);

// The server's per-request usage (proto/generate.proto's Usage), widened for sums.
struct UsageCounts {
  int64_t prompt_tokens = 0, completion_tokens = 0;
  int64_t pool_tokens = 0, host_tokens = 0, disk_tokens = 0, remote_tokens = 0, computed_tokens = 0;
  int64_t document_tokens = 0, document_cached_tokens = 0, document_computed_tokens = 0;
  int64_t chunk_hits = 0, chunk_misses = 0;
  int64_t cached_documents = 0;                         // per request: its documents reused whole
  int64_t chunk_recomputes = 0, recomputed_tokens = 0;  // held by the tier, computed by choice: not misses
  uint64_t kv_bytes_copied = 0, kv_bytes_fetched = 0;
  uint64_t host_bytes_fetched = 0, disk_bytes_fetched = 0, remote_bytes_fetched = 0;

  UsageCounts& operator+=(const UsageCounts& o);
};

struct RequestResult {
  int id = 0;
  std::string status = "OK";  // absl::StatusCodeToString of the call's status
  std::string error;          // the status message
  double scheduled_s = 0;     // intended start, seconds from the run's start
  double sent_s = 0;          // actual start
  // Client-side, from the intended start (so a client falling behind an open-loop
  // schedule shows as latency instead of hiding it); -1 when no token came.
  double ttft_ms = -1;
  double total_ms = 0;
  std::vector<double> itl_ms;  // gaps between consecutive token-carrying deltas
  int64_t tokens_received = 0;
  std::vector<int32_t> output_tokens;  // as streamed: greedy outputs compare across modes
  std::string finish_reason, mode;     // from the final message
  UsageCounts usage;
  double server_queue_ms = 0, server_ttft_ms = 0, server_total_ms = 0;
  // The host's monotonic clock (ns) at the call's send and first token's read here, and the
  // server's at the handler's first line, its first token and that token's Write (Timings): the transit's
  // split when client and server share a host (bench/served_transit.py); 0 when unknown.
  int64_t sent_monotonic_ns = 0, first_read_monotonic_ns = 0;
  int64_t server_arrival_monotonic_ns = 0, server_first_in_handler_monotonic_ns = 0,
          server_first_write_monotonic_ns = 0;

  bool ok() const { return status == "OK"; }
};

struct LoadSummary {
  int64_t requests = 0, succeeded = 0;
  std::map<std::string, int64_t> errors;        // status code name -> requests
  std::map<std::string, int64_t> modes_served;  // the mode each successful request reports
  double wall_s = 0;
  double request_throughput = 0;           // successful requests per second
  double output_token_throughput = 0;      // completion tokens per second
  Distribution ttft_ms, itl_ms, total_ms;  // client-side
  // Client-side TTFT of the requests with k of their documents cached, per k: a hit-heavy
  // mix and a miss-heavy mix are not the same latency, whatever the mode.
  std::map<int64_t, Distribution> ttft_ms_by_cached_documents;
  Distribution server_queue_ms, server_ttft_ms, server_total_ms;  // the server's timings
  UsageCounts usage;                                              // summed over the successful requests
  // Document tokens served from any cache over document tokens requested.
  double hit_ratio = 0;
  int64_t distinct_document_tokens = 0;
  // Document tokens prefilled over distinct document tokens: 1.0 = each document once.
  double fleet_compute = 0;
};

// Tokens of the distinct documents (by content, as the worker keys them) that the
// trace's requests use.
int64_t DistinctDocumentTokens(const RagTrace& trace);

LoadSummary SummarizeRun(const std::vector<RequestResult>& results, double wall_s, int64_t distinct_document_tokens);

}  // namespace lazykv
