// Token sampling: greedy (temperature 0), temperature, and top-p (nucleus), seeded.
#pragma once

#include <cstdint>
#include <span>

#include "absl/status/status.h"

namespace lazykv {

struct SamplingParams {
  int max_tokens = 64;
  float temperature = 0.0f;  // 0: greedy
  float top_p = 1.0f;
  uint64_t seed = 0;

  absl::Status Validate() const;
};

// A portable generator (splitmix64): the same seed gives the same tokens everywhere.
class SamplerRng {
 public:
  explicit SamplerRng(uint64_t seed) : state_(seed) {}
  double NextUnit();  // uniform in [0, 1)

 private:
  uint64_t state_;
};

struct SampledToken {
  int32_t id;
  float logprob;  // under the model's raw distribution (softmax of the logits)
};

SampledToken SampleToken(std::span<const float> logits, const SamplingParams& params, SamplerRng& rng);

}  // namespace lazykv
