// Backend::ForwardAndSample's default (the logits come back, the host samples) and the
// checks every implementation shares.
#include <cmath>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "worker/backend/backend.h"

namespace lazykv {

absl::Status ValidateSampling(std::span<const SequenceStep> steps, std::span<const StepSampling> sampling) {
  if (sampling.size() != steps.size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%d sampling entries for %d steps", sampling.size(), steps.size()));
  }
  for (size_t i = 0; i < steps.size(); ++i) {
    if (!sampling[i].sample) continue;
    const RowSampling& row = sampling[i].row;
    if (steps[i].logits != LogitsWanted::kLast || steps[i].tokens.empty()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("step %d is sampled but does not want the logits of its last token", i));
    }
    if (!(row.temperature >= 0.0f) || !std::isfinite(row.temperature) || !(row.top_p > 0.0f && row.top_p <= 1.0f) ||
        !(row.uniform >= 0.0 && row.uniform < 1.0)) {
      return absl::InvalidArgumentError(absl::StrFormat("step %d: temperature %g, top_p %g, uniform %g out of range", i,
                                                        row.temperature, row.top_p, row.uniform));
    }
  }
  return absl::OkStatus();
}

absl::Status Backend::ForwardAndSample(std::span<const SequenceStep> steps, std::span<const StepSampling> sampling,
                                       std::vector<SampledToken>* tokens, std::vector<std::vector<float>>* logits) {
  RETURN_IF_ERROR(ValidateSampling(steps, sampling));
  RETURN_IF_ERROR(Forward(steps, logits));
  tokens->assign(steps.size(), SampledToken{.id = -1, .logprob = 0.0f});
  for (size_t i = 0; i < steps.size(); ++i) {
    if (!sampling[i].sample) continue;
    (*tokens)[i] = SampleRow((*logits)[i], sampling[i].row);
    if (!sampling[i].keep_logits) std::vector<float>().swap((*logits)[i]);
  }
  return absl::OkStatus();
}

}  // namespace lazykv
