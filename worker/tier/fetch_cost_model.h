// Fetch or recompute (DESIGN.md section 4): moving estimates of what a chunk costs from
// each source and to compute here, so a worker fetches only when the fetch is expected
// to finish sooner than computing the chunk in its own batch. A remote fetch over gRPC
// (~2 GB/s) loses to an H100 recomputing an 8B model's 512-token chunk (~12 ms for
// 64 MiB); a fetch from pinned host memory wins; on a CPU backend fetching always wins.
//
// Fetch time from a source is fitted as latency + bytes / bandwidth, and a forward step
// as base + per_token * prefill tokens (its marginal prefill cost), both by exponentially
// weighted least squares over recent samples.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/mutex.h"

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
  double decay = 0.9;      // weight of the past per new sample
  int explore_every = 32;  // every Nth "recompute" choice per source fetches anyway, to keep measuring
};

// Thread-safe: pipeline threads record fetches, the scheduling thread records steps, any
// thread decides.
class FetchCostModel {
 public:
  explicit FetchCostModel(FetchCostOptions options = {}) : options_(options) {}

  // A fetch of `bytes` from `source` ("host", "disk", "remote HOST:PORT") that took
  // `seconds` from the tier call to the bytes staged for import.
  void RecordFetch(const std::string& source, uint64_t bytes, double seconds) ABSL_LOCKS_EXCLUDED(mu_);
  // A forward step that ran `prefill_tokens` of prefill in `seconds`.
  void RecordStep(int prefill_tokens, double seconds) ABSL_LOCKS_EXCLUDED(mu_);

  std::optional<double> FetchSeconds(const std::string& source, uint64_t bytes) const ABSL_LOCKS_EXCLUDED(mu_);
  // The marginal cost of `tokens` more prefill tokens in a step.
  std::optional<double> ComputeSeconds(int tokens) const ABSL_LOCKS_EXCLUDED(mu_);
  // A whole step with `tokens` of prefill (its fixed cost included): how long computing a
  // chunk of `tokens` takes in practice. Nullopt before any step was measured.
  std::optional<double> StepSeconds(int tokens) const ABSL_LOCKS_EXCLUDED(mu_);

  enum class Choice {
    kFetch,      // expected sooner than recomputing
    kRecompute,  // recomputing is expected sooner, or the source is being measured by another fetch
    kExplore,    // a fetch that measures the source: unmeasured, or one in explore_every recompute choices
  };
  // An unmeasured source gets one fetch at a time (a probe), so a burst of requests does
  // not send every chunk to a source that may be far slower than computing; the others
  // are recomputed until the probe reports. After kExplore, call ProbeDone for the
  // source once the fetch is over (RecordFetch of the same source also ends it).
  Choice Decide(const std::string& source, uint64_t bytes, int tokens) ABSL_LOCKS_EXCLUDED(mu_);
  void ProbeDone(const std::string& source) ABSL_LOCKS_EXCLUDED(mu_);

  struct SourceEstimate {
    std::string source;
    double latency_seconds = 0;
    double bytes_per_second = 0;  // 0: not measured
    uint64_t samples = 0;
  };
  std::vector<SourceEstimate> Sources() const ABSL_LOCKS_EXCLUDED(mu_);
  // Seconds per prefill token (0: not measured yet).
  double PrefillSecondsPerToken() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Source {
    explicit Source(double decay) : fit(decay) {}
    DecayingLinearFit fit;
    uint64_t recomputes = 0;
    bool probing = false;  // a measuring fetch is under way
  };
  const FetchCostOptions options_;
  mutable Mutex mu_;
  std::map<std::string, Source> sources_ ABSL_GUARDED_BY(mu_);
  DecayingLinearFit steps_ ABSL_GUARDED_BY(mu_){options_.decay};
};

}  // namespace lazykv
