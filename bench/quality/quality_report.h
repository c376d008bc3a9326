// The output-quality run's per-case metrics, its sanity checks and its report
// (bench/quality/): markdown tables with 95% confidence intervals, and one CSV row per case
// and setting for the plot script (bench/quality/plot_quality.py).
#pragma once

#include <string>
#include <vector>

#include "bench/quality/quality_cases.h"
#include "bench/quality/quality_metrics.h"
#include "bench/quality/quality_run.h"

namespace lazykv::quality {

struct CaseMetrics {
  bool ran = false;
  Agreement agreement;  // greedy free run against the reference setting's
  double ref_nll = 0;   // mean NLL per token of the reference's free run (teacher-forced)
  int ref_tokens = 0;
  double held_nll = 0;  // mean NLL per token of the held-out text
  int held_tokens = 0;
  bool answer_correct = false;  // every answer token (" COLOR OBJECT") is the greedy choice
  double answer_nll = 0;        // -log p(answer | prompt): summed over its tokens
  bool recalls_object = false;  // the free run names the relevant document's object
  bool wrong_object = false;    // the free run names another in-context document's object
};

using MetricsTable = std::vector<std::array<CaseMetrics, kNumSettings>>;
MetricsTable ComputeMetrics(const std::vector<StoryDoc>& corpus, const std::vector<QualityCase>& cases,
                            const RunResults& results);

// Two settings that must compute the same function (prefix and none; lazy and block),
// compared case by case over the free runs' sketched logits (steps up to the first token
// that differs) and every teacher-forced log-probability (same targets only).
struct Equivalence {
  int cases = 0;
  int same_tokens = 0;             // cases whose free runs are identical
  double max_logit_rel_error = 0;  // RelativeL2Error of the sketched logits, worst step
  double max_logprob_diff = 0;     // |difference| of a target token's log-probability, worst
};
Equivalence CompareSettings(const RunResults& results, SettingId a, SettingId b);

struct QualityChecks {
  Equivalence prefix_vs_none;
  Equivalence lazy_vs_block;
  // The control must score the held-out text worse than none (mean NLL), else the cases do
  // not depend on their documents.
  double none_held_nll = 0;
  double control_held_nll = 0;
  // Failures, each a sentence; empty when every check holds. Tolerances: prefix equals none
  // to 1e-4 (relative logits, same tokens everywhere); lazy equals block to 1e-3 (relative
  // logits where the tokens agree; tokens may differ only where two logits tie to rounding).
  std::vector<std::string> failures;
};
QualityChecks RunChecks(const RunResults& results, const MetricsTable& metrics);

struct ReportContext {
  std::string model, command, machine, date;
  std::vector<int32_t> long_anchor;
  std::string long_anchor_text;
  int free_run_tokens = 0;
  bool long_anchor_ran = true;
  bool anchorless_ran = true;
  bool repair_ran = true;
};

std::string MarkdownReport(const std::vector<QualityCase>& cases, const MetricsTable& metrics,
                           const QualityChecks& checks, const RunResults& results, const ReportContext& context);
// Header: case,count,placement,setting,agree_prefix,agree_overall,ref_nll,ref_tokens,held_nll,
// held_tokens,answer_correct,answer_nll,recalls_object,wrong_object
std::string MetricsCsv(const std::vector<QualityCase>& cases, const MetricsTable& metrics);

}  // namespace lazykv::quality
