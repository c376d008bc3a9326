// Replays a RAG trace against a worker's Generation service (proto/generate.proto):
// open-loop at the trace's Poisson arrival offsets when its rate is positive, else a
// closed loop with its concurrency in flight. One thread per in-flight request: the
// concurrency of a load test is small, and blocking reads timestamp each delta simply.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/load_stats.h"
#include "bench/rag_trace.h"
#include "common/security/transport_security.h"

namespace lazykv {

struct ReplayOptions {
  std::string target{};              // HOST:PORT
  ClientSecurityOptions security{};  // TLS and token for the target
  std::string mode{};                // the per-request mode override; empty: the worker's --mode
  int deadline_ms = 0;               // per request; 0: none
  bool progress = false;             // a progress bar on stderr
  // > 0: each document goes as text of about this many bytes (bench/document_text.h, from its
  // id), which the worker tokenizes, as an OpenAI-API client's documents; 0: as token ids.
  int document_text_bytes = 0;
};

struct ReplayRun {
  std::vector<RequestResult> results;  // in trace order
  double wall_s = 0;                   // first send to last completion
  int worker_vocab_size = 0;
  int worker_max_context = 0;
};

// Asks the worker's Tokenize for its vocabulary first: FAILED_PRECONDITION when the
// trace's token ids do not fit it, UNAVAILABLE when the worker does not answer. Failed
// requests are results (their status code name), not errors of the replay.
absl::StatusOr<ReplayRun> ReplayTrace(const RagTrace& trace, const ReplayOptions& options);

}  // namespace lazykv
