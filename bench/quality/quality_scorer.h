// Scoring through the engine (bench/quality/): a greedy free run, and teacher-forced
// log-likelihood of a fixed target continuation, with requests batched through one engine.
//
// The engine keeps logits only for the tokens it samples (GenerateRequest::record_logits:
// one row per decoding step), so a target T after a prompt P is scored by greedy decoding
// from P + T[0..pos): the logits of step s predict T[pos + s] as long as the greedy tokens
// before it equal T's. At the first step whose greedy token differs from T, that step's
// logits still score T[pos + s]; the next request restarts from P + T[0..pos + s + 1). So a
// target costs one request plus one per greedy mismatch, and every position is scored with
// exactly the target before it, in the request's attention mode (the restart's prompt
// attends to everything, like the free run's generated tokens). A request is stopped
// (Engine::StopEarly) at its first mismatch, except a free run that must run to its end.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "worker/engine/engine.h"

namespace lazykv::quality {

struct ScoringJobSpec {
  std::vector<std::vector<int32_t>> docs;
  std::vector<int32_t> prompt;
  AttentionMode mode = AttentionMode::kLazy;  // the first request's (the free run's)
  // The restarts' mode: kPrefix may stand in for kNone (the same function, checked by the
  // harness), so that restarts reuse the cached prefix instead of recomputing it.
  AttentionMode restart_mode = AttentionMode::kLazy;
  // Greedy tokens of the free run (the first request). With `score_free_run`, the target is
  // the free run itself (its tokens, then EOS if it stopped); else `target`, and the free run
  // is target.size() tokens long.
  int free_run_tokens = 0;
  bool score_free_run = false;
  // The target to score; may end with an end-of-sequence id (only at its end). Read from the
  // first NextRequest on, so that it may be filled in after the spec is built.
  const std::vector<int32_t>* target = nullptr;
  // The free run goes to its end (its tokens are compared with a reference's); else it
  // stops at its first token that differs from the target, like every restart.
  bool full_free_run = true;
  // Logit ids kept from each free-run step (a sketch for comparing modes); empty: none.
  std::span<const int32_t> sketch_ids;
  int repair_tokens = 0;  // GenerateRequest::repair_tokens of every request
};

// What a job measured.
struct ScoringOutput {
  std::vector<int32_t> generated;          // the free run's greedy tokens, then its EOS when it stopped
  std::vector<std::vector<float>> sketch;  // per free-run step, logits at the sketch ids
  std::vector<double> logprobs;            // per target token: log p(T[i] | P, T[0..i))
  std::vector<uint8_t> top1;               // per target token: the greedy choice was T[i]
  int requests = 0;                        // engine requests the job used
  // The first request's prompt tokens and what it computed (the repair's cost).
  int prompt_tokens = 0, computed_tokens = 0, repaired_tokens = 0;
};

// One scoring job: a free run, then restarts until every target token is scored.
// Not thread-safe.
class ScoringJob {
 public:
  explicit ScoringJob(ScoringJobSpec spec) : spec_(std::move(spec)) {}

  // The next request to submit; none when the job is done. Call again only after Take.
  std::optional<GenerateRequest> NextRequest();
  // A token the current request sampled: true when the request may stop now (it left the
  // target, and nothing after this token is needed).
  bool OnToken(int32_t token);
  // The finished request's result. INTERNAL when it scores nothing new (a stuck job).
  absl::Status Take(const GenerateResult& result);
  bool done() const { return done_; }
  const ScoringOutput& output() const { return out_; }
  const std::vector<int32_t>& target() const;

 private:
  ScoringJobSpec spec_;
  ScoringOutput out_;
  std::vector<int32_t> own_target_;  // the free run, when it is the target
  bool free_run_done_ = false;
  bool done_ = false;
  size_t pos_ = 0;             // target tokens scored
  size_t request_tokens_ = 0;  // tokens the current request sampled so far
};

// Runs every job to completion through `engine`, at most `max_in_flight` requests at once
// (continuous batching; jobs with a follow-up request go first). The first failed request
// ends the run with its status. The engine must be idle when called and is idle after.
absl::Status RunJobs(Engine& engine, std::span<ScoringJob* const> jobs, int max_in_flight);

}  // namespace lazykv::quality
