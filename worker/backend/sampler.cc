#include "worker/backend/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/splitmix64.h"

namespace lazykv {

absl::Status SamplingParams::Validate() const {
  if (max_tokens < 0) return absl::InvalidArgumentError(absl::StrFormat("max_tokens: %d is negative", max_tokens));
  if (!(temperature >= 0.0f) || !std::isfinite(temperature)) {
    return absl::InvalidArgumentError(absl::StrFormat("temperature %g must be finite and >= 0", temperature));
  }
  if (!(top_p > 0.0f && top_p <= 1.0f)) {
    return absl::InvalidArgumentError(absl::StrFormat("top_p %g must be in (0, 1]", top_p));
  }
  if (stop_token_ids.size() > kMaxStopTokenIds) {
    return absl::InvalidArgumentError(
        absl::StrFormat("stop_token_ids: %d ids, at most %d", stop_token_ids.size(), kMaxStopTokenIds));
  }
  return absl::OkStatus();
}

double SamplerRng::NextUnit() { return SplitMix64Unit(state_); }

RowSampling NextRowSampling(const SamplingParams& params, SamplerRng& rng) {
  return RowSampling{.temperature = params.temperature,
                     .top_p = params.top_p,
                     .uniform = params.temperature == 0.0f ? 0.0 : rng.NextUnit()};
}

SampledToken SampleToken(std::span<const float> logits, const SamplingParams& params, SamplerRng& rng) {
  return SampleRow(logits, NextRowSampling(params, rng));
}

SampledToken SampleRow(std::span<const float> logits, const RowSampling& params) {
  const int n = static_cast<int>(logits.size());
  const float max_logit = *std::max_element(logits.begin(), logits.end());
  double log_sum = 0;
  for (float l : logits) log_sum += std::exp(static_cast<double>(l - max_logit));
  const double log_z = max_logit + std::log(log_sum);
  auto logprob = [&](int id) { return static_cast<float>(logits[id] - log_z); };

  if (params.temperature == 0.0f) {
    const int id = static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    return {id, logprob(id)};
  }
  // Tempered probabilities, then the smallest most-probable set reaching top_p.
  std::vector<double> probs(n);
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += probs[i] = std::exp((logits[i] - max_logit) / params.temperature);
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return probs[a] > probs[b]; });
  int keep = n;
  if (params.top_p < 1.0f) {
    double cumulative = 0;
    for (int i = 0; i < n; ++i) {
      cumulative += probs[order[i]] / sum;
      if (cumulative >= params.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  double kept_mass = 0;
  for (int i = 0; i < keep; ++i) kept_mass += probs[order[i]];
  const double target = params.uniform * kept_mass;
  double cumulative = 0;
  for (int i = 0; i < keep; ++i) {
    cumulative += probs[order[i]];
    if (target < cumulative) return {order[i], logprob(order[i])};
  }
  return {order[keep - 1], logprob(order[keep - 1])};
}

}  // namespace lazykv
