// `lazykv-bench compare`: the same trace against each attention mode with everything
// else identical, then one table, DIR/compare.json and DIR/compare.png.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "bench/load_stats.h"
#include "bench/rag_trace.h"
#include "common/security/transport_security.h"

namespace lazykv {

struct CompareOptions {
  // Either a worker binary, started fresh per mode, or the address of one running worker
  // (modes then differ only by the per-request override and share its state).
  std::string worker;
  std::string target;
  ClientSecurityOptions target_security;  // TLS and token for --target
  std::string model, tokenizer;
  std::vector<std::string> worker_args;  // appended to each worker's command line
  std::vector<std::string> modes = {"lazy", "block", "prefix", "none"};
  std::string out_dir = "compare-results";
  int deadline_ms = 0;
  int document_text_bytes = 0;  // ReplayOptions::document_text_bytes
  bool progress = false;
  std::string python = "/usr/bin/python3";
  std::string plot_script;
};

struct ModeRun {
  std::string mode;
  LoadSummary summary;
  std::vector<RequestResult> results;
  int worker_exit_code = 0;  // the worker's exit code after SIGTERM (0 with --target)
};

// Runs every mode, prints the table on stdout, writes the JSON and the plot (a failed
// plot is a warning). An error when a worker does not start, the replay cannot run, or a
// worker exits other than 0 on SIGTERM (after the table and JSON are written).
absl::Status RunCompare(const RagTrace& trace, const CompareOptions& options);

}  // namespace lazykv
