// Fetch or recompute (DESIGN.md section 4): moving estimates of what a chunk costs from
// each source and to compute here, so a worker fetches only when the fetch is expected
// to finish sooner than computing the chunk in its own batch. A remote fetch over gRPC
// (~2 GB/s) loses to an H100 recomputing an 8B model's 512-token chunk (~12 ms for
// 64 MiB); a fetch from pinned host memory wins; on a CPU backend fetching always wins.
//
// Fetch time from a source is fitted as latency + bytes / bandwidth by exponentially
// weighted least squares over recent samples. The marginal cost of a prefill token comes
// from a fit of recent steps that tells prefill apart from decoding (step_cost_fit.h),
// held within a factor of two of a calibration (a chunk-sized prefill timed alone at
// start) when there is one.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "worker/tier/step_cost_fit.h"

namespace lazykv {

// y = intercept + slope * x over recent samples (older ones decay). Not thread-safe.
class DecayingLinearFit {
 public:
  explicit DecayingLinearFit(double decay) : decay_(decay) {}
  void Add(double x, double y);
  uint64_t samples() const { return samples_; }
  // nullopt before the first sample. With x (nearly) constant so far, or a negative slope,
  // the fit is a line through the origin: y = x * mean(y) / mean(x).
  std::optional<double> Predict(double x) const;
  double intercept() const;
  double slope() const;

 private:
  void Solve(double* intercept, double* slope) const;
  double decay_;
  double w_ = 0, x_ = 0, y_ = 0, xx_ = 0, xy_ = 0;
  uint64_t samples_ = 0;
};

struct FetchCostOptions {
  double decay = 0.9;        // weight of the past per new sample
  double step_decay = 0.98;  // the same for the step fit (four terms need more samples)
  int explore_every = 32;  // every Nth "recompute" choice per source fetches anyway, to keep measuring
                           // (every 4th while the source has fewer than 4 fetches measured)
};

// Thread-safe: pipeline threads record fetches, the scheduling thread records steps, any
// thread decides.
class FetchCostModel {
 public:
  explicit FetchCostModel(FetchCostOptions options = {}) : options_(options) {}

  // A fetch of `bytes` from `source` ("host", "disk", "remote HOST:PORT") that took
  // `seconds` from the tier call to the bytes staged for import.
  void RecordFetch(const std::string& source, uint64_t bytes, double seconds) ABSL_LOCKS_EXCLUDED(mu_);
  // A forward step of `step`'s shape that took `seconds`.
  void RecordStep(const StepShape& step, double seconds) ABSL_LOCKS_EXCLUDED(mu_);
  // A prefill of `tokens` tokens timed alone (a worker's start-up calibration): anchors the
  // per-token cost, which the steps' fit then moves within a factor of two of.
  void CalibratePrefill(int tokens, double seconds) ABSL_LOCKS_EXCLUDED(mu_);

  std::optional<double> FetchSeconds(const std::string& source, uint64_t bytes) const ABSL_LOCKS_EXCLUDED(mu_);
  // The marginal cost of `tokens` more prefill tokens in a step.
  std::optional<double> ComputeSeconds(int tokens) const ABSL_LOCKS_EXCLUDED(mu_);
  // A whole step with `tokens` of prefill (its fixed cost included): how long computing a
  // chunk of `tokens` takes in practice. Nullopt before any step was measured.
  std::optional<double> StepSeconds(int tokens) const ABSL_LOCKS_EXCLUDED(mu_);

  enum class Choice {
    kFetch,       // expected sooner than recomputing
    kRecompute,   // recomputing is expected sooner
    kExplore,     // a fetch that measures the source: unmeasured, or one in explore_every recompute choices
    kAwaitProbe,  // the source is unmeasured and its probe is under way: AwaitProbe, then decide again
  };
  // An unmeasured source gets one fetch at a time (a probe), so a burst of requests does
  // not send every chunk to a source that may be far slower than computing; the others
  // wait for the probe's answer (AwaitProbe, bounded by what computing would cost) and then
  // decide on it. After kExplore, call ProbeDone for the source once the fetch is over
  // (RecordFetch of the same source also ends it).
  // `queued_tokens`: prefill waiting ahead of a chunk computed now (its compute ends after
  // theirs).
  Choice Decide(const std::string& source, uint64_t bytes, int tokens, int64_t queued_tokens = 0)
      ABSL_LOCKS_EXCLUDED(mu_);
  void ProbeDone(const std::string& source) ABSL_LOCKS_EXCLUDED(mu_);
  // Returns when `source`'s probe is over or at `deadline`, whichever is first.
  void AwaitProbe(const std::string& source, std::chrono::steady_clock::time_point deadline)
      ABSL_LOCKS_EXCLUDED(mu_);

  struct SourceEstimate {
    std::string source;
    double latency_seconds = 0;
    double bytes_per_second = 0;  // 0: not measured
    uint64_t samples = 0;
  };
  std::vector<SourceEstimate> Sources() const ABSL_LOCKS_EXCLUDED(mu_);
  // Seconds per prefill token (0: not measured yet).
  double PrefillSecondsPerToken() const ABSL_LOCKS_EXCLUDED(mu_);
  // Its parts: the calibration's (0: none) and the steps' fit's (0: not identified yet).
  double CalibratedSecondsPerToken() const ABSL_LOCKS_EXCLUDED(mu_);
  double FittedSecondsPerToken() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Source {
    explicit Source(double decay) : fit(decay) {}
    DecayingLinearFit fit;
    uint64_t recomputes = 0;
    bool probing = false;  // a measuring fetch is under way
  };
  const FetchCostOptions options_;
  mutable Mutex mu_;
  CondVar probe_over_;  // a probe reported (RecordFetch or ProbeDone)
  std::optional<double> PerTokenLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::map<std::string, Source> sources_ ABSL_GUARDED_BY(mu_);
  DecayingLinearFit steps_ ABSL_GUARDED_BY(mu_){options_.decay};  // whole steps (StepSeconds)
  StepCostFit step_shapes_ ABSL_GUARDED_BY(mu_){options_.step_decay};
  double calibrated_per_token_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace lazykv
