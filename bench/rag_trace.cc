#include "bench/rag_trace.h"

#include <cmath>
#include <set>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/splitmix64.h"
#include "common/zipf.h"

namespace lazykv {
namespace {

using nlohmann::json;

// Draws document lengths as the spec says; INVALID_ARGUMENT names a bad spec.
absl::StatusOr<std::vector<int>> DrawLengths(const std::string& spec, int n, uint64_t& rng) {
  const std::vector<std::string> parts = absl::StrSplit(spec, ':');
  std::vector<double> args;
  for (size_t i = 1; i < parts.size(); ++i) {
    double v;
    if (!absl::SimpleAtod(parts[i], &v) || v <= 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("doc lengths '%s': '%s' is not a positive number", spec, parts[i]));
    }
    args.push_back(v);
  }
  std::vector<int> lengths(n);
  for (int& length : lengths) {
    double x;
    if (parts[0] == "fixed" && args.size() == 1) {
      x = args[0];
    } else if (parts[0] == "uniform" && args.size() == 2 && args[0] <= args[1]) {
      x = args[0] + std::floor(SplitMix64Unit(rng) * (args[1] - args[0] + 1));
    } else if (parts[0] == "lognormal" && args.size() == 2) {
      const double u1 = std::max(1e-12, SplitMix64Unit(rng)), u2 = SplitMix64Unit(rng);
      x = std::round(args[0] * std::exp(args[1] * std::sqrt(-2 * std::log(u1)) * std::cos(2 * M_PI * u2)));
    } else {
      return absl::InvalidArgumentError(
          absl::StrFormat("doc lengths '%s': use fixed:N, uniform:A:B or lognormal:MEDIAN:SIGMA", spec));
    }
    length = std::max(1, static_cast<int>(x));
  }
  return lengths;
}

std::vector<int32_t> RandomTokens(int n, int vocab, uint64_t& rng) {
  std::vector<int32_t> tokens(n);
  for (int32_t& t : tokens) t = 3 + static_cast<int32_t>(SplitMix64(rng) % static_cast<uint64_t>(vocab - 3));
  return tokens;
}

}  // namespace

absl::StatusOr<RagTrace> GenerateTrace(const TraceOptions& o) {
  if (o.num_docs <= 0) return absl::InvalidArgumentError("docs must be positive");
  if (o.docs_per_request < 0 || o.docs_per_request > o.num_docs) {
    return absl::InvalidArgumentError(
        absl::StrFormat("docs per request %d must be between 0 and the %d documents", o.docs_per_request, o.num_docs));
  }
  if (o.zipf_s < 0) return absl::InvalidArgumentError("zipf s must be >= 0");
  if (o.vocab_size <= 3) return absl::InvalidArgumentError("vocab must be > 3");
  if (o.rate < 0 || o.concurrency <= 0) return absl::InvalidArgumentError("rate >= 0 and concurrency > 0");
  RagTrace trace;
  trace.options = o;
  uint64_t rng = o.seed;
  auto lengths = DrawLengths(o.doc_lengths, o.num_docs, rng);
  if (!lengths.ok()) return lengths.status();
  for (int length : *lengths) trace.documents.push_back(RandomTokens(length, o.vocab_size, rng));
  trace.ranking.resize(o.num_docs);
  for (int i = 0; i < o.num_docs; ++i) trace.ranking[i] = i;
  for (int i = o.num_docs - 1; i > 0; --i) std::swap(trace.ranking[i], trace.ranking[SplitMix64(rng) % (i + 1)]);
  const ZipfSampler zipf(o.num_docs, o.zipf_s);
  double clock = 0;
  for (int r = 0; r < o.num_requests; ++r) {
    TraceRequest request;
    request.id = r;
    if (o.rate > 0) {
      clock += -std::log(1 - SplitMix64Unit(rng)) / o.rate;  // exponential gaps: Poisson arrivals
      request.arrival_s = clock;
    }
    std::set<int> chosen;
    while (static_cast<int>(chosen.size()) < o.docs_per_request) {
      const int doc = trace.ranking[zipf.Sample(rng)];
      if (chosen.insert(doc).second) request.doc_ids.push_back(doc);
    }
    for (int i = static_cast<int>(request.doc_ids.size()) - 1; i > 0; --i) {
      std::swap(request.doc_ids[i], request.doc_ids[SplitMix64(rng) % (i + 1)]);
    }
    request.question = RandomTokens(o.question_tokens, o.vocab_size, rng);
    request.max_tokens = o.max_tokens;
    trace.requests.push_back(std::move(request));
  }
  return trace;
}

nlohmann::json TraceOptionsToJson(const TraceOptions& o) {
  return {{"docs", o.num_docs},
          {"docs_per_request", o.docs_per_request},
          {"zipf_s", o.zipf_s},
          {"requests", o.num_requests},
          {"doc_lengths", o.doc_lengths},
          {"question_tokens", o.question_tokens},
          {"max_tokens", o.max_tokens},
          {"vocab", o.vocab_size},
          {"rate", o.rate},
          {"concurrency", o.concurrency},
          {"seed", o.seed}};
}

std::string TraceToJsonLines(const RagTrace& trace) {
  json corpus = {{"kind", "corpus"},
                 {"options", TraceOptionsToJson(trace.options)},
                 {"ranking", trace.ranking},
                 {"documents", trace.documents}};
  std::string out = corpus.dump() + "\n";
  for (const TraceRequest& r : trace.requests) {
    out += json{{"kind", "request"},    {"id", r.id},           {"arrival_s", r.arrival_s},
                {"doc_ids", r.doc_ids}, {"prompt", r.question}, {"max_tokens", r.max_tokens}}
               .dump();
    out += "\n";
  }
  return out;
}

absl::StatusOr<RagTrace> ParseTraceJsonLines(const std::string& text) {
  RagTrace trace;
  std::istringstream in(text);
  std::string line;
  for (int line_no = 1; std::getline(in, line); ++line_no) {
    if (line.empty()) continue;
    const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.contains("kind")) {
      return absl::InvalidArgumentError(absl::StrFormat("trace line %d: not a trace record", line_no));
    }
    try {
      if (j["kind"] == "corpus") {
        const json& o = j["options"];
        trace.options = TraceOptions{o["docs"],        o["docs_per_request"], o["zipf_s"],     o["requests"],
                                     o["doc_lengths"], o["question_tokens"],  o["max_tokens"], o["vocab"],
                                     o["rate"],        o["concurrency"],      o["seed"]};
        trace.documents = j["documents"].get<std::vector<std::vector<int32_t>>>();
        trace.ranking = j["ranking"].get<std::vector<int>>();
      } else {
        TraceRequest r{j["id"], j["arrival_s"], j["doc_ids"].get<std::vector<int>>(),
                       j["prompt"].get<std::vector<int32_t>>(), j["max_tokens"]};
        for (int d : r.doc_ids) {
          if (d < 0 || d >= static_cast<int>(trace.documents.size())) {
            return absl::InvalidArgumentError(
                absl::StrFormat("trace line %d: doc id %d not in the corpus", line_no, d));
          }
        }
        trace.requests.push_back(std::move(r));
      }
    } catch (const json::exception& e) {
      return absl::InvalidArgumentError(absl::StrFormat("trace line %d: %s", line_no, e.what()));
    }
  }
  if (trace.documents.empty()) return absl::InvalidArgumentError("trace has no corpus line");
  return trace;
}

}  // namespace lazykv
