#include "worker/tier/fetch_cost_model.h"

#include <algorithm>
#include <cmath>

namespace lazykv {
namespace {
// Fetches under which a source explores every few recompute choices (FetchCostModel::Decide).
constexpr uint64_t kFewSamples = 4;
}  // namespace

void DecayingLinearFit::Add(double x, double y) {
  w_ = w_ * decay_ + 1;
  x_ = x_ * decay_ + x;
  y_ = y_ * decay_ + y;
  xx_ = xx_ * decay_ + x * x;
  xy_ = xy_ * decay_ + x * y;
  ++samples_;
}

void DecayingLinearFit::Solve(double* intercept, double* slope) const {
  const double mean_x = x_ / w_, mean_y = y_ / w_;
  const double var_x = xx_ / w_ - mean_x * mean_x;
  // x spread under 1% of its mean: the slope is not identifiable; go through the origin.
  if (var_x > 1e-4 * mean_x * mean_x && var_x > 0) {
    const double b = (xy_ / w_ - mean_x * mean_y) / var_x;
    const double a = mean_y - b * mean_x;
    if (b >= 0 && a >= 0) {
      *intercept = a;
      *slope = b;
      return;
    }
    if (b >= 0) {  // a negative intercept: a line through the origin fits the samples better
      *intercept = 0;
      *slope = xy_ / xx_;
      return;
    }
  }
  *intercept = mean_x > 0 ? 0 : mean_y;
  *slope = mean_x > 0 ? mean_y / mean_x : 0;
}

std::optional<double> DecayingLinearFit::Predict(double x) const {
  if (samples_ == 0) return std::nullopt;
  double a, b;
  Solve(&a, &b);
  return a + b * x;
}

double DecayingLinearFit::intercept() const {
  if (samples_ == 0) return 0;
  double a, b;
  Solve(&a, &b);
  return a;
}

double DecayingLinearFit::slope() const {
  if (samples_ == 0) return 0;
  double a, b;
  Solve(&a, &b);
  return b;
}

void FetchCostModel::RecordFetch(const std::string& source, uint64_t bytes, double seconds) {
  MutexLock lock(&mu_);
  Source& s = sources_.try_emplace(source, options_.decay).first->second;
  s.fit.Add(static_cast<double>(bytes), seconds);
  s.probing = false;
  probe_over_.SignalAll();
}

void FetchCostModel::ProbeDone(const std::string& source) {
  MutexLock lock(&mu_);
  if (auto it = sources_.find(source); it != sources_.end()) it->second.probing = false;
  probe_over_.SignalAll();
}

void FetchCostModel::AwaitProbe(const std::string& source, std::chrono::steady_clock::time_point deadline) {
  MutexLock lock(&mu_);
  while (std::chrono::steady_clock::now() < deadline) {
    auto it = sources_.find(source);
    if (it == sources_.end() || !it->second.probing) return;
    probe_over_.WaitUntil(&mu_, deadline);
  }
}

void FetchCostModel::RecordStep(const StepShape& step, double seconds) {
  MutexLock lock(&mu_);
  steps_.Add(step.prefill_tokens, seconds);
  step_shapes_.Add(step, seconds);
}

void FetchCostModel::CalibratePrefill(int tokens, double seconds) {
  if (tokens <= 0 || !(seconds > 0)) return;
  MutexLock lock(&mu_);
  calibrated_per_token_ = seconds / tokens;
}

namespace {
// Steps before the step fit's prefill rate is used (four terms need a few samples each).
constexpr uint64_t kMinShapeSamples = 8;
}  // namespace

std::optional<double> FetchCostModel::PerTokenLocked() const {
  std::optional<double> fitted;
  if (step_shapes_.samples() >= kMinShapeSamples) fitted = step_shapes_.PrefillSecondsPerToken();
  if (calibrated_per_token_ > 0) {
    if (!fitted) return calibrated_per_token_;
    return std::clamp(*fitted, calibrated_per_token_ / 2, calibrated_per_token_ * 2);
  }
  if (fitted) return fitted;
  // Uncalibrated and not identified yet: whole steps against their prefill tokens.
  if (steps_.samples() == 0) return std::nullopt;
  return steps_.slope();
}

std::optional<double> FetchCostModel::FetchSeconds(const std::string& source, uint64_t bytes) const {
  MutexLock lock(&mu_);
  auto it = sources_.find(source);
  if (it == sources_.end()) return std::nullopt;
  return it->second.fit.Predict(static_cast<double>(bytes));
}

std::optional<double> FetchCostModel::ComputeSeconds(int tokens) const {
  MutexLock lock(&mu_);
  const std::optional<double> per_token = PerTokenLocked();
  if (!per_token) return std::nullopt;
  return *per_token * tokens;
}

std::optional<double> FetchCostModel::StepSeconds(int tokens) const {
  MutexLock lock(&mu_);
  if (steps_.samples() == 0) return std::nullopt;
  return steps_.Predict(tokens);
}

FetchCostModel::Choice FetchCostModel::Decide(const std::string& source, uint64_t bytes, int tokens,
                                              int64_t queued_tokens) {
  const int64_t ahead = std::clamp<int64_t>(queued_tokens, 0, 1 << 24);
  const std::optional<double> compute = ComputeSeconds(static_cast<int>(tokens + ahead));
  MutexLock lock(&mu_);
  Source& s = sources_.try_emplace(source, options_.decay).first->second;
  if (s.fit.samples() == 0) {  // unmeasured: one probe at a time
    if (s.probing) return Choice::kAwaitProbe;
    s.probing = true;
    return Choice::kExplore;
  }
  const double fetch = *s.fit.Predict(static_cast<double>(bytes));
  // The step rate is measured from the first forward pass on; before it, trust the source.
  if (!compute || *compute <= 0 || fetch < *compute) return Choice::kFetch;
  // A source measured only a few times explores more often: one slow first fetch (a cold
  // path) must not keep it recomputed for long.
  const uint64_t every = s.fit.samples() < kFewSamples ? std::min<uint64_t>(kFewSamples, options_.explore_every)
                                                       : options_.explore_every;
  if (every > 0 && ++s.recomputes % every == 0 && !s.probing) {
    s.probing = true;
    return Choice::kExplore;
  }
  return Choice::kRecompute;
}

std::vector<FetchCostModel::SourceEstimate> FetchCostModel::Sources() const {
  MutexLock lock(&mu_);
  std::vector<SourceEstimate> out;
  for (const auto& [name, s] : sources_) {
    const double slope = s.fit.slope();
    out.push_back(SourceEstimate{name, s.fit.intercept(), slope > 0 ? 1.0 / slope : 0.0, s.fit.samples()});
  }
  return out;
}

double FetchCostModel::PrefillSecondsPerToken() const {
  MutexLock lock(&mu_);
  return PerTokenLocked().value_or(0);
}

double FetchCostModel::CalibratedSecondsPerToken() const {
  MutexLock lock(&mu_);
  return calibrated_per_token_;
}

double FetchCostModel::FittedSecondsPerToken() const {
  MutexLock lock(&mu_);
  if (step_shapes_.samples() < kMinShapeSamples) return 0;
  return step_shapes_.PrefillSecondsPerToken().value_or(0);
}

}  // namespace lazykv
