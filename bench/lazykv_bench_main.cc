// lazykv-bench: load-test tools. `trace` writes a seeded Zipf RAG trace as JSON lines
// (bench/rag_trace.h); the replay and compare commands come with the serving layer.
#include <fstream>
#include <iostream>

#include "bench/rag_trace.h"
#include "common/flag_parser.h"

namespace lazykv {
namespace {

constexpr char kTraceUsage[] = R"(usage: lazykv-bench trace [options] [--out FILE]
  --docs D               corpus size (default 100)
  --docs-per-request K   distinct documents per request (default 8)
  --zipf-s S             popularity skew over a fixed random ranking; 0 is uniform (default 1.1)
  --requests N           (default 200)
  --doc-lengths SPEC     fixed:N | uniform:A:B | lognormal:MEDIAN:SIGMA tokens (default fixed:512)
  --question-tokens N    (default 16)
  --max-tokens N         tokens to generate per request (default 32)
  --vocab V              token ids drawn from [3, V) (default 512)
  --rate R               open-loop Poisson arrivals per second; 0: closed loop (default 0)
  --concurrency C        closed-loop concurrency (default 1)
  --seed S               (default 1)
)";

int Trace(int argc, char** argv) {
  TraceOptions o;
  std::string out_path;
  FlagParser parser(kTraceUsage);
  parser.AddInt("--docs", &o.num_docs);
  parser.AddInt("--docs-per-request", &o.docs_per_request);
  parser.AddDouble("--zipf-s", &o.zipf_s);
  parser.AddInt("--requests", &o.num_requests);
  parser.AddString("--doc-lengths", &o.doc_lengths);
  parser.AddInt("--question-tokens", &o.question_tokens);
  parser.AddInt("--max-tokens", &o.max_tokens);
  parser.AddInt("--vocab", &o.vocab_size);
  parser.AddDouble("--rate", &o.rate);
  parser.AddInt("--concurrency", &o.concurrency);
  parser.AddUint64("--seed", &o.seed);
  parser.AddString("--out", &out_path);
  if (absl::Status s = parser.Parse(argc, argv); !s.ok()) {
    std::cerr << s.message() << "\n";
    return absl::IsCancelled(s) ? 0 : 2;
  }
  auto trace = GenerateTrace(o);
  if (!trace.ok()) {
    std::cerr << "lazykv-bench trace: " << trace.status().message() << "\n";
    return 2;
  }
  const std::string text = TraceToJsonLines(*trace);
  if (out_path.empty()) {
    std::cout << text;
  } else {
    std::ofstream(out_path) << text;
  }
  return 0;
}

}  // namespace
}  // namespace lazykv

int main(int argc, char** argv) {
  const std::string command = argc > 1 ? argv[1] : "";
  if (command == "trace") return lazykv::Trace(argc - 1, argv + 1);
  std::cerr << "usage: lazykv-bench trace [options]   (lazykv-bench trace --help)\n";
  return command.empty() || command == "--help" ? 0 : 2;
}
