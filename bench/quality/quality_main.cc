// lazykv-quality: output quality of lazy reuse against full attention on a trained model
// (issue 24). Builds seeded document-grounded cases (bench/quality/quality_cases.h), runs
// every setting through in-process engines on the CPU backend (bench/quality/quality_run.h)
// and prints markdown tables; --out-md and --out-csv keep them (plots:
// bench/quality/plot_quality.py over the CSV).
#include <fstream>
#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bench/quality/quality_report.h"
#include "common/flag_parser.h"
#include "common/status_macros.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"
#include "worker/setup/model_setup.h"

namespace lazykv::quality {
namespace {

constexpr char kUsage[] = R"(usage: lazykv-quality --model PATH [flags]
  --model PATH            llama2.c checkpoint (e.g. ../shared/models/stories15M.bin)
  --tokenizer PATH        its tokenizer (default: next to the model)
  --counts LIST           documents per case (default 1,2,4,8)
  --cases-per-group N     cases per (count, position) group (default 32: 288 cases)
  --corpus-docs N         documents in the corpus, each a distinct name (default 64)
  --free-run-tokens N     greedy tokens per free run (default 20)
  --long-anchor TEXT      the long anchor after BOS (default: a two-sentence story opening)
  --no-long-anchor        skip the long-anchor settings
  --no-anchorless         skip the no-anchor settings (none and lazy on an engine with
                          EngineOptions::anchorless: no anchor, no BOS)
  --no-repair             skip the repair settings (lazy with each document's first 4 and 16
                          tokens recomputed in context: GenerateRequest::repair_tokens)
  --max-in-flight N       requests batched through an engine at once (default 32)
  --check-every N         run the sanity baselines prefix and block on every N-th case (default 4)
  --kv-pool BYTES         each engine's KV pool (default 512MiB)
  --seed N                cases, corpus and sketches (default 1)
  --out-md FILE           the markdown report
  --out-csv FILE          one row per case and setting (bench/quality/plot_quality.py)
  --command TEXT, --machine TEXT, --date TEXT   recorded in the report's header
)";

absl::StatusOr<std::vector<int>> ParseIntList(const std::string& text) {
  std::vector<int> out;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int v;
    if (!absl::SimpleAtoi(part, &v)) return absl::InvalidArgumentError(absl::StrCat("not a number: ", part));
    out.push_back(v);
  }
  return out;
}

absl::Status WriteFile(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
  f.close();
  if (!f) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  ModelSetupOptions setup;
  setup.device = Device::kCpu;
  setup.dtype = ModelDtype::kFp32;
  setup.kv_pool_bytes = 512ull << 20;
  setup.cache_tier.enabled = false;
  CaseOptions case_options;
  RunOptions run_options;
  bool no_repair = false;
  std::string counts = "1,2,4,8", long_anchor = "The sun was shining and the birds were singing.";
  std::string out_md, out_csv;
  ReportContext context;
  bool no_long_anchor = false, no_anchorless = false;
  FlagParser parser(kUsage);
  parser.AddString("--model", &setup.model);
  parser.AddString("--tokenizer", &setup.tokenizer);
  parser.AddString("--counts", &counts);
  parser.AddInt("--cases-per-group", &case_options.cases_per_group);
  parser.AddInt("--corpus-docs", &case_options.corpus_docs);
  parser.AddInt("--free-run-tokens", &run_options.free_run_tokens);
  parser.AddString("--long-anchor", &long_anchor);
  parser.AddSwitch("--no-long-anchor", &no_long_anchor);
  parser.AddSwitch("--no-anchorless", &no_anchorless);
  parser.AddSwitch("--no-repair", &no_repair);
  parser.AddInt("--max-in-flight", &run_options.max_in_flight);
  parser.AddInt("--check-every", &run_options.check_every);
  parser.AddByteSize("--kv-pool", &setup.kv_pool_bytes);
  parser.AddUint64("--seed", &case_options.seed);
  parser.AddString("--out-md", &out_md);
  parser.AddString("--out-csv", &out_csv);
  parser.AddString("--command", &context.command);
  parser.AddString("--machine", &context.machine);
  parser.AddString("--date", &context.date);
  if (absl::Status s = parser.Parse(argc, argv); !s.ok()) {
    std::cerr << s.message() << "\n";
    return absl::IsCancelled(s) ? 0 : 2;
  }
  if (setup.model.empty()) {
    std::cerr << "lazykv-quality: --model is required\n" << kUsage;
    return 2;
  }
  auto count_list = ParseIntList(counts);
  if (!count_list.ok()) {
    std::cerr << "lazykv-quality: --counts: " << count_list.status().message() << "\n";
    return 2;
  }
  case_options.counts = *count_list;
  run_options.seed = case_options.seed;
  run_options.long_anchor = !no_long_anchor;
  run_options.anchorless = !no_anchorless;
  run_options.repair = !no_repair;

  std::array<std::unique_ptr<Engine>, 3> engines;
  std::unique_ptr<Tokenizer> tokenizer;
  for (int a = 0; a < 3; ++a) {
    if ((a == 1 && !run_options.long_anchor) || (a == 2 && !run_options.anchorless)) continue;
    if (a == 2) {
      setup.engine.anchor.clear();
      setup.engine.anchorless = true;
    }
    if (a == 1) {
      setup.engine.anchor = {engines[0]->config().bos_id};
      const std::vector<int32_t> text = tokenizer->Encode(long_anchor);
      setup.engine.anchor.insert(setup.engine.anchor.end(), text.begin(), text.end());
      context.long_anchor = setup.engine.anchor;
      context.long_anchor_text = long_anchor;
    }
    auto loaded = SetUpEngine(setup);
    if (!loaded.ok()) {
      std::cerr << "lazykv-quality: " << loaded.status() << "\n";
      return 1;
    }
    engines[a] = std::move(loaded->engine);
    if (a == 0) tokenizer = std::move(loaded->tokenizer);
  }
  auto corpus = BuildCorpus(*tokenizer, case_options.corpus_docs, case_options.seed);
  if (!corpus.ok()) {
    std::cerr << "lazykv-quality: " << corpus.status() << "\n";
    return 2;
  }
  auto cases = BuildCases(*corpus, *tokenizer, case_options);
  if (!cases.ok()) {
    std::cerr << "lazykv-quality: " << cases.status() << "\n";
    return 2;
  }
  spdlog::info("{} cases over {} documents; e.g. doc \"{}\", prompt \"{}\", held-out \"{}\"", cases->size(),
               corpus->size(), (*corpus)[cases->front().relevant_doc].text, tokenizer->Decode(cases->front().prompt),
               DecodeContinuation(*tokenizer, cases->front().prompt, cases->front().held_out));
  auto results = RunQuality({engines[0].get(), engines[1].get(), engines[2].get()}, *corpus, *cases, run_options);
  if (!results.ok()) {
    std::cerr << "lazykv-quality: " << results.status() << "\n";
    return 1;
  }
  const MetricsTable metrics = ComputeMetrics(*corpus, *cases, *results);
  const QualityChecks checks = RunChecks(*results, metrics);
  context.model = setup.model;
  context.free_run_tokens = run_options.free_run_tokens;
  context.long_anchor_ran = run_options.long_anchor;
  context.anchorless_ran = run_options.anchorless;
  context.repair_ran = run_options.repair;
  const std::string report = MarkdownReport(*cases, metrics, checks, *results, context);
  std::cout << report;
  for (const auto& [path, text] : {std::pair{out_md, report}, std::pair{out_csv, MetricsCsv(*cases, metrics)}}) {
    if (path.empty()) continue;
    if (absl::Status s = WriteFile(path, text); !s.ok()) {
      std::cerr << "lazykv-quality: " << s << "\n";
      return 1;
    }
  }
  return checks.failures.empty() ? 0 : 3;
}

}  // namespace
}  // namespace lazykv::quality

int main(int argc, char** argv) {
  spdlog::set_default_logger(spdlog::stderr_color_mt("lazykv-quality"));  // stdout is the report's
  return lazykv::quality::Main(argc, argv);
}
