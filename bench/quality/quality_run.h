// The output-quality run (issue 24): every case through every setting (an attention mode,
// an anchor, real or control documents), on one engine per anchor setting (BOS, the long
// anchor, none at all: EngineOptions::anchorless).
//
// Per case and setting, two scoring jobs (bench/quality/quality_scorer.h):
//  - continuation: a greedy free run of `free_run_tokens`, and the teacher-forced
//    log-likelihood of the reference setting's free run (`none` with the same anchor);
//  - held-out: the teacher-forced log-likelihood of the case's held-out text.
// The `none` settings' restarts and held-out jobs run in `prefix` mode, which the same run
// checks to be the same function (the free runs of `prefix` and `none` are compared token
// for token and logit for logit), so that they reuse the free run's prefix. `prefix` and
// `block` are sanity baselines (they must equal `none` and `lazy`) and run on every
// `check_every`-th case only.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/quality/quality_cases.h"
#include "bench/quality/quality_scorer.h"
#include "worker/engine/engine.h"

namespace lazykv::quality {

enum SettingId {
  kNone,
  kPrefix,
  kBlock,
  kLazy,
  kControl,
  kNoneLong,
  kLazyLong,
  kNoneBare,  // no anchor, no BOS: each document encoded alone from position 0
  kLazyBare,
  kLazyRepair4,  // lazy with GenerateRequest::repair_tokens 4, then 16
  kLazyRepair16,
  kNumSettings
};

struct Setting {
  const char* name;
  int anchor;  // 0: BOS (the design default), 1: the long anchor, 2: none (anchorless)
  AttentionMode mode;
  AttentionMode restart_mode;
  bool control;         // the relevant document swapped for an unrelated one
  SettingId reference;  // whose free run the continuation is scored against (itself: a baseline)
  int repair = 0;       // GenerateRequest::repair_tokens of every request
};

const std::array<Setting, kNumSettings>& Settings();

struct RunOptions {
  int free_run_tokens = 20;
  int max_in_flight = 32;
  bool long_anchor = true;  // run the long-anchor settings (needs engines[1])
  bool anchorless = true;   // run the no-anchor settings (needs engines[2])
  bool repair = true;       // run the repair settings
  int sketch_size = 256;    // logit ids kept per free-run step for the mode comparisons
  int check_every = 4;      // prefix and block run on cases whose index is a multiple of it
  uint64_t seed = 1;
};

// One (case, setting): the continuation job's and the held-out job's outputs.
struct CaseSettingResult {
  bool ran = false;
  ScoringOutput continuation;
  ScoringOutput held_out;
};

struct RunResults {
  std::vector<std::array<CaseSettingResult, kNumSettings>> per_case;
  // Engine requests and wall time per pass, for the report.
  int requests = 0;
  double seconds = 0;
};

// engines[0] has the BOS anchor; engines[1] the long anchor (null when !long_anchor);
// engines[2] is anchorless (null when !anchorless).
// Every case must fit the model's context with free_run_tokens (and its anchor).
absl::StatusOr<RunResults> RunQuality(std::array<Engine*, 3> engines, const std::vector<StoryDoc>& corpus,
                                      const std::vector<QualityCase>& cases, const RunOptions& options);

// The fixed logit ids the sketches keep (seeded, distinct, within the vocabulary).
std::vector<int32_t> SketchIds(int vocab_size, int count, uint64_t seed);

}  // namespace lazykv::quality
