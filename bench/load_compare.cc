#include "bench/load_compare.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "bench/load_replay.h"
#include "bench/load_report.h"
#include "common/child_process.h"
#include "spdlog/spdlog.h"

namespace lazykv {
namespace {

namespace fs = std::filesystem;

ReplayOptions ReplayOptionsFor(const CompareOptions& o, const std::string& target, const std::string& mode) {
  ReplayOptions replay;
  replay.target = target;
  if (target == o.target) replay.security = o.target_security;  // a worker it started itself is plaintext on loopback
  replay.mode = mode;
  replay.deadline_ms = o.deadline_ms;
  replay.document_text_bytes = o.document_text_bytes;
  replay.progress = o.progress;
  return replay;
}

// The trace replayed with `replay`, summarized as `mode`'s run.
absl::StatusOr<ModeRun> ReplayMode(const RagTrace& trace, const ReplayOptions& replay, const std::string& mode,
                                   int64_t distinct_tokens) {
  auto run = ReplayTrace(trace, replay);
  if (!run.ok()) return run.status();
  ModeRun result;
  result.mode = mode;
  result.summary = SummarizeRun(run->results, run->wall_s, distinct_tokens);
  result.results = std::move(run->results);
  return result;
}

// Replays the trace against a fresh worker in `mode`: its own empty cache directory, so
// no mode inherits another's chunks.
absl::StatusOr<ModeRun> RunFreshWorker(const RagTrace& trace, const CompareOptions& o, const std::string& mode,
                                       int64_t distinct_tokens) {
  const fs::path cache_dir = fs::path(o.out_dir) / ("cache-" + mode);
  const fs::path log = fs::path(o.out_dir) / ("worker-" + mode + ".log");
  std::error_code ec;
  fs::remove_all(cache_dir, ec);
  fs::create_directories(cache_dir, ec);
  if (ec) return absl::InternalError(absl::StrFormat("creating %s: %s", cache_dir.string(), ec.message()));
  fs::remove(log, ec);
  std::vector<std::string> args = {"--listen",    "127.0.0.1:0",      "--model", o.model,
                                   "--cache-dir", cache_dir.string(), "--mode",  mode};
  if (!o.tokenizer.empty()) args.insert(args.end(), {"--tokenizer", o.tokenizer});
  args.insert(args.end(), o.worker_args.begin(), o.worker_args.end());
  spdlog::info("{}: starting {} {}", mode, o.worker, absl::StrJoin(args, " "));
  ServerProcess worker(o.worker, args, log.string());
  if (!worker.started()) {
    return absl::UnavailableError(absl::StrFormat("the %s worker did not start (first line '%s'; see %s)", mode,
                                                  worker.first_line(), log.string()));
  }
  // The worker's --mode decides; the request carries no override, as in a deployment.
  auto result = ReplayMode(trace, ReplayOptionsFor(o, worker.address(), ""), mode, distinct_tokens);
  const int exit_code = worker.Stop(SIGTERM);
  if (!result.ok()) return result.status();
  result->worker_exit_code = exit_code;
  if (exit_code != 0) spdlog::error("{}: the worker exited {} on SIGTERM (see {})", mode, exit_code, log.string());
  return result;
}

// `python script json png`; the exit code (127: could not run it).
int RunPlot(const CompareOptions& o, const std::string& json_path, const std::string& png_path) {
  const pid_t pid = fork();
  if (pid < 0) return 127;
  if (pid == 0) {
    dup2(STDERR_FILENO, STDOUT_FILENO);  // stdout is the table's
    std::vector<std::string> args = {o.python, o.plot_script, json_path, png_path};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(o.python.c_str(), argv.data());
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

absl::Status RunCompare(const RagTrace& trace, const CompareOptions& o) {
  if (o.worker.empty() == o.target.empty()) return absl::InvalidArgumentError("give one of --worker and --target");
  if (!o.worker.empty() && o.model.empty()) return absl::InvalidArgumentError("--worker needs --model");
  std::error_code ec;
  fs::create_directories(o.out_dir, ec);
  if (ec) return absl::InternalError(absl::StrFormat("creating %s: %s", o.out_dir, ec.message()));

  const int64_t distinct_tokens = DistinctDocumentTokens(trace);
  std::vector<ModeRun> runs;
  for (const std::string& mode : o.modes) {
    auto run = o.worker.empty() ? ReplayMode(trace, ReplayOptionsFor(o, o.target, mode), mode, distinct_tokens)
                                : RunFreshWorker(trace, o, mode, distinct_tokens);
    if (!run.ok()) return run.status();
    runs.push_back(std::move(*run));
  }

  std::vector<std::pair<std::string, LoadSummary>> rows;
  for (const ModeRun& r : runs) rows.emplace_back(r.mode, r.summary);
  std::cout << absl::StrFormat(
      "trace: %d requests, %d documents of %s tokens, %d per request, zipf s %.2f, %s\n", trace.options.num_requests,
      trace.options.num_docs, trace.options.doc_lengths, trace.options.docs_per_request, trace.options.zipf_s,
      trace.options.rate > 0 ? absl::StrFormat("Poisson %.2f req/s", trace.options.rate)
                             : absl::StrFormat("closed loop, concurrency %d", trace.options.concurrency));
  if (!o.target.empty()) std::cout << "(one worker at " << o.target << ": modes share its KV pool and cache)\n";
  std::cout << FormatCompareTable(rows) << std::flush;

  nlohmann::json modes = nlohmann::json::array();
  for (const ModeRun& r : runs) {
    nlohmann::json j = RunToJson(r.summary, r.results);
    j["mode"] = r.mode;
    j["worker_exit_code"] = r.worker_exit_code;
    modes.push_back(std::move(j));
  }
  const nlohmann::json out = {{"trace_options", TraceOptionsToJson(trace.options)},
                              {"worker", o.worker.empty() ? nlohmann::json(nullptr) : nlohmann::json(o.worker)},
                              {"target", o.target.empty() ? nlohmann::json(nullptr) : nlohmann::json(o.target)},
                              {"model", o.model},
                              {"modes", std::move(modes)}};
  const std::string json_path = (fs::path(o.out_dir) / "compare.json").string();
  const std::string png_path = (fs::path(o.out_dir) / "compare.png").string();
  {
    std::ofstream file(json_path);
    file << out.dump(1) << "\n";
    if (!file) return absl::InternalError("writing " + json_path);
  }
  std::cout << "results: " << json_path << "\n";

  fs::remove(png_path, ec);
  if (const int code = RunPlot(o, json_path, png_path); code != 0 || !fs::exists(png_path)) {
    spdlog::warn("no plot: {} {} exited {} (python3-matplotlib installed?)", o.python, o.plot_script, code);
  } else {
    std::cout << "plot: " << png_path << "\n";
  }

  for (const ModeRun& r : runs) {
    if (r.worker_exit_code != 0) {
      return absl::InternalError(absl::StrFormat("the %s worker exited %d on SIGTERM", r.mode, r.worker_exit_code));
    }
  }
  return absl::OkStatus();
}

}  // namespace lazykv
