#include "bench/quality/quality_metrics.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

namespace lazykv::quality {

double LogProbOf(std::span<const float> logits, int32_t token) {
  if (token < 0 || static_cast<size_t>(token) >= logits.size()) return -std::numeric_limits<double>::infinity();
  double max = -std::numeric_limits<double>::infinity();
  for (float v : logits) max = std::max(max, static_cast<double>(v));
  double sum = 0;
  const float fmax = static_cast<float>(max);
  for (float v : logits) sum += std::exp(v - fmax);  // fp32 terms, double sum
  return static_cast<double>(logits[token]) - max - std::log(sum);
}

int32_t ArgMax(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best]) best = static_cast<int32_t>(i);
  }
  return best;
}

double MeanNll(std::span<const double> logprobs) {
  if (logprobs.empty()) return 0;
  double sum = 0;
  for (double lp : logprobs) sum -= lp;
  return sum / logprobs.size();
}

double Perplexity(std::span<const double> logprobs) { return std::exp(MeanNll(logprobs)); }

Agreement GreedyAgreement(std::span<const int32_t> generated, std::span<const int32_t> reference) {
  Agreement a;
  if (reference.empty()) return a;
  size_t first = reference.size();
  size_t equal = 0;
  for (size_t i = 0; i < reference.size(); ++i) {
    const bool same = i < generated.size() && generated[i] == reference[i];
    if (same) {
      ++equal;
    } else if (first == reference.size()) {
      first = i;
    }
  }
  a.first_divergence = static_cast<int>(first);
  a.prefix = static_cast<double>(first) / reference.size();
  a.overall = static_cast<double>(equal) / reference.size();
  return a;
}

double RelativeL2Error(std::span<const float> a, std::span<const float> b) {
  if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    diff += d * d;
    norm += static_cast<double>(b[i]) * b[i];
  }
  return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

namespace {
double Mean(std::span<const double> values) {
  double sum = 0;
  for (double v : values) sum += v;
  return values.empty() ? 0 : sum / values.size();
}
}  // namespace

Interval BootstrapMean(std::span<const double> values, int resamples, uint64_t seed) {
  Interval out;
  out.n = static_cast<int>(values.size());
  out.mean = Mean(values);
  out.low = out.high = out.mean;
  if (values.size() < 2 || resamples < 2) return out;
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<size_t> pick(0, values.size() - 1);
  std::vector<double> means(resamples);
  for (double& m : means) {
    double sum = 0;
    for (size_t i = 0; i < values.size(); ++i) sum += values[pick(rng)];
    m = sum / values.size();
  }
  std::sort(means.begin(), means.end());
  out.low = means[static_cast<size_t>(0.025 * (resamples - 1))];
  out.high = means[static_cast<size_t>(std::ceil(0.975 * (resamples - 1)))];
  return out;
}

Interval NormalMean(std::span<const double> values) {
  Interval out;
  out.n = static_cast<int>(values.size());
  out.mean = Mean(values);
  out.low = out.high = out.mean;
  if (values.size() < 2) return out;
  double ss = 0;
  for (double v : values) ss += (v - out.mean) * (v - out.mean);
  const double half = 1.96 * std::sqrt(ss / (values.size() - 1)) / std::sqrt(static_cast<double>(values.size()));
  out.low = out.mean - half;
  out.high = out.mean + half;
  return out;
}

Interval ExpInterval(const Interval& log_interval) {
  return Interval{.mean = std::exp(log_interval.mean),
                  .low = std::exp(log_interval.low),
                  .high = std::exp(log_interval.high),
                  .n = log_interval.n};
}

}  // namespace lazykv::quality
