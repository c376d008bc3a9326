// A RAG workload trace (issue 4's load tests): a corpus of D documents with lengths from
// a configurable distribution; each request takes K distinct documents drawn with
// Zipf(s) popularity over a fixed random ranking (s = 0: uniform), in random order,
// plus a question; arrivals are open-loop Poisson at a rate, or back to back for a
// fixed concurrency. Seeded: the same options give the same trace everywhere.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace lazykv {

struct TraceOptions {
  int num_docs = 100;
  int docs_per_request = 8;
  double zipf_s = 1.1;
  int num_requests = 200;
  // Document lengths in tokens: "fixed:N", "uniform:A:B" or "lognormal:MEDIAN:SIGMA".
  std::string doc_lengths = "fixed:512";
  int question_tokens = 16;
  int max_tokens = 32;
  int vocab_size = 512;  // token ids are drawn from [3, vocab_size)
  double rate = 0;       // requests per second (Poisson); 0: closed loop
  int concurrency = 1;   // with rate 0
  uint64_t seed = 1;
};

struct TraceRequest {
  int id = 0;
  double arrival_s = 0;  // offset from the start (0 for closed loop)
  std::vector<int> doc_ids;
  std::vector<int32_t> question;
  int max_tokens = 0;
};

struct RagTrace {
  TraceOptions options;
  std::vector<std::vector<int32_t>> documents;
  std::vector<int> ranking;  // ranking[r]: the document of popularity rank r
  std::vector<TraceRequest> requests;
};

absl::StatusOr<RagTrace> GenerateTrace(const TraceOptions& options);

// The options as the corpus line writes them (also in load-test results).
nlohmann::json TraceOptionsToJson(const TraceOptions& options);

// JSON lines: a corpus line, then one line per request.
std::string TraceToJsonLines(const RagTrace& trace);
absl::StatusOr<RagTrace> ParseTraceJsonLines(const std::string& text);

}  // namespace lazykv
