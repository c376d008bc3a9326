// lazykv-bench: load-test tools. `trace` writes a seeded Zipf RAG trace as JSON lines
// (bench/rag_trace.h), `load` replays one against a worker (bench/load_replay.h),
// `compare` replays it against each attention mode (bench/load_compare.h).
#include <unistd.h>

#include <fstream>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/load_compare.h"
#include "bench/load_replay.h"
#include "bench/load_report.h"
#include "bench/rag_trace.h"
#include "common/flag_parser.h"
#include "common/mapped_file.h"
#include "common/status_macros.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

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

constexpr char kLoadUsage[] = R"(usage: lazykv-bench load --target HOST:PORT --trace FILE [options]
Replays a trace (lazykv-bench trace) against a running lazykv-worker: open-loop Poisson
arrivals when the trace has a rate, else a closed loop at its concurrency; documents and
questions go as token ids, greedy sampling.
  --target HOST:PORT   the worker
  --trace FILE         the trace (JSON lines)
  --mode MODE          per-request mode override: lazy | block | prefix | none (default: the worker's)
  --out FILE           the results as JSON (summary and every request)
  --deadline-ms N      per-request deadline; 0: none (default 0)
  --document-text N    send each document as about N bytes of text made from its id, which the
                       worker tokenizes (as an OpenAI-API client must); 0: token ids (default)
Security (a worker with --tls-cert, --auth-tokens):
)";

constexpr char kCompareUsage[] =
    R"(usage: lazykv-bench compare (--worker BINARY --model M | --target HOST:PORT) --trace FILE [options]
Replays the trace once per mode and prints one table; writes DIR/compare.json (every
mode's results and the trace options) and DIR/compare.png (TTFT distribution and
throughput per mode; needs python3-matplotlib).
  --worker BINARY      lazykv-worker: a fresh one per mode on 127.0.0.1:0 with an empty
                       --cache-dir under DIR and --mode MODE, stopped with SIGTERM after
  --model M            the worker's --model (with --worker)
  --tokenizer T        the worker's --tokenizer (with --worker)
  --worker-arg ARG     one more argument for each worker (repeatable)
  --target HOST:PORT   instead of --worker: one running worker, the mode sent per request;
                       its KV pool and cache tier are shared across the modes, so a later
                       mode finds what earlier ones cached
  --trace FILE         the trace (JSON lines)
  --modes LIST         comma-separated (default lazy,block,prefix,none)
  --out-dir DIR        (default compare-results)
  --deadline-ms N      per-request deadline; 0: none (default 0)
  --document-text N    documents as about N bytes of text each (see load); 0: token ids
  --plot-script PATH   (default the source tree's bench/plot_compare.py)
Security towards --target (a worker with --tls-cert, --auth-tokens):
)";

absl::StatusOr<RagTrace> ReadTrace(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text, ReadFileToString(path));
  return ParseTraceJsonLines(text);
}

absl::Status CheckMode(const std::string& mode) {
  if (mode == "lazy" || mode == "block" || mode == "prefix" || mode == "none") return absl::OkStatus();
  return absl::InvalidArgumentError("unknown mode '" + mode + "': use lazy, block, prefix or none");
}

// Flag errors exit 2 (0 for --help), like `trace`.
int FlagExit(const absl::Status& s) {
  std::cerr << s.message() << "\n";
  return absl::IsCancelled(s) ? 0 : 2;
}

int Load(int argc, char** argv) {
  ReplayOptions options;
  std::string trace_path, out_path;
  FlagParser parser(absl::StrCat(kLoadUsage, ClientSecurityUsage("")));
  AddClientSecurityFlags(parser, options.security, "");
  parser.AddString("--target", &options.target);
  parser.AddString("--trace", &trace_path);
  parser.Add("--mode", [&](const std::string& v) {
    options.mode = v;
    return CheckMode(v);
  });
  parser.AddString("--out", &out_path);
  parser.AddInt("--deadline-ms", &options.deadline_ms);
  parser.AddInt("--document-text", &options.document_text_bytes);
  if (absl::Status s = parser.Parse(argc, argv); !s.ok()) return FlagExit(s);
  if (options.target.empty() || trace_path.empty()) return FlagExit(absl::InvalidArgumentError(parser.usage()));
  if (absl::Status s = CheckClientSecurity(options.target, options.security); !s.ok()) {
    return FlagExit(absl::InvalidArgumentError(absl::StrCat("--", s.message())));
  }
  auto trace = ReadTrace(trace_path);
  if (!trace.ok()) {
    std::cerr << "lazykv-bench load: " << trace.status().message() << "\n";
    return 2;
  }
  options.progress = isatty(STDERR_FILENO);
  auto run = ReplayTrace(*trace, options);
  if (!run.ok()) {
    std::cerr << "lazykv-bench load: " << run.status().message() << "\n";
    return 1;
  }
  const LoadSummary summary = SummarizeRun(run->results, run->wall_s, DistinctDocumentTokens(*trace));
  std::cout << FormatLoadTable(summary) << std::flush;
  if (!out_path.empty()) {
    nlohmann::json out = RunToJson(summary, run->results);
    out["trace_options"] = TraceOptionsToJson(trace->options);
    out["target"] = options.target;
    out["mode_override"] = options.mode;
    std::ofstream file(out_path);
    file << out.dump(1) << "\n";
    if (!file) {
      std::cerr << "lazykv-bench load: cannot write " << out_path << "\n";
      return 1;
    }
  }
  return 0;
}

int Compare(int argc, char** argv) {
  CompareOptions options;
  options.plot_script = LAZYKV_PLOT_SCRIPT;
  std::string trace_path, modes;
  FlagParser parser(absl::StrCat(kCompareUsage, ClientSecurityUsage("")));
  AddClientSecurityFlags(parser, options.target_security, "");
  parser.AddString("--worker", &options.worker);
  parser.AddString("--model", &options.model);
  parser.AddString("--tokenizer", &options.tokenizer);
  parser.Add("--worker-arg", [&](const std::string& v) {
    options.worker_args.push_back(v);
    return absl::OkStatus();
  });
  parser.AddString("--target", &options.target);
  parser.AddString("--trace", &trace_path);
  parser.AddString("--modes", &modes);
  parser.AddString("--out-dir", &options.out_dir);
  parser.AddInt("--deadline-ms", &options.deadline_ms);
  parser.AddInt("--document-text", &options.document_text_bytes);
  parser.AddString("--plot-script", &options.plot_script);
  if (absl::Status s = parser.Parse(argc, argv); !s.ok()) return FlagExit(s);
  if (!modes.empty()) {
    options.modes = absl::StrSplit(modes, ',', absl::SkipEmpty());
    for (const std::string& mode : options.modes) {
      if (absl::Status s = CheckMode(mode); !s.ok()) return FlagExit(s);
    }
  }
  if (trace_path.empty()) return FlagExit(absl::InvalidArgumentError(parser.usage()));
  if (!options.target.empty()) {
    if (absl::Status s = CheckClientSecurity(options.target, options.target_security); !s.ok()) {
      return FlagExit(absl::InvalidArgumentError(absl::StrCat("--", s.message())));
    }
  }
  auto trace = ReadTrace(trace_path);
  if (!trace.ok()) {
    std::cerr << "lazykv-bench compare: " << trace.status().message() << "\n";
    return 2;
  }
  options.progress = isatty(STDERR_FILENO);
  if (absl::Status s = RunCompare(*trace, options); !s.ok()) {
    std::cerr << "lazykv-bench compare: " << s.message() << "\n";
    return absl::IsInvalidArgument(s) ? 2 : 1;
  }
  return 0;
}

}  // namespace
}  // namespace lazykv

int main(int argc, char** argv) {
  spdlog::set_default_logger(spdlog::stderr_color_mt("lazykv-bench"));  // stdout is the table's
  const std::string command = argc > 1 ? argv[1] : "";
  if (command == "trace") return lazykv::Trace(argc - 1, argv + 1);
  if (command == "load") return lazykv::Load(argc - 1, argv + 1);
  if (command == "compare") return lazykv::Compare(argc - 1, argv + 1);
  std::cerr << "usage: lazykv-bench trace|load|compare [options]   (lazykv-bench COMMAND --help)\n";
  return command.empty() || command == "--help" ? 0 : 2;
}
