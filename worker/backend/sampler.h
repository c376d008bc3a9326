// Token sampling: greedy (temperature 0), temperature, and top-p (nucleus), seeded.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>
#include <span>

#include "absl/status/status.h"

namespace lazykv {

struct SamplingParams {
  int max_tokens = 64;
  float temperature = 0.0f;  // 0: greedy
  float top_p = 1.0f;
  // Absent: the engine draws a fresh seed per request (and reports it, so that the request
  // can be replayed); two unseeded sampled requests do not repeat each other.
  std::optional<uint64_t> seed;
  // Ids that end the reply, besides the model's end-of-sequence ids (a chat template's end
  // of turn, e.g. Llama 3's <|eot_id|>); like those, not part of the reply. At most
  // kMaxStopTokenIds.
  std::vector<int32_t> stop_token_ids;
  static constexpr size_t kMaxStopTokenIds = 64;

  absl::Status Validate() const;
};

// A portable generator (splitmix64): the same seed gives the same tokens everywhere.
// Not thread-safe: one request's generator, used by the engine's thread.
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

// One row's sampling once the request's generator has been consulted: the uniform is drawn
// on the host (only when temperature > 0, as SampleToken does), so a device sampling the
// row picks what SampleRow would with the same uniform.
struct RowSampling {
  float temperature = 0.0f;  // 0: greedy (uniform unused)
  float top_p = 1.0f;
  double uniform = 0.0;  // in [0, 1)
};

// Draws from rng exactly when SampleToken would.
RowSampling NextRowSampling(const SamplingParams& params, SamplerRng& rng);

// Greedy: the first maximal logit (lowest id). Else the tempered probabilities
// exp((l - max) / temperature) (fp32 exp, as float math gives them) in decreasing order,
// ties by id, truncated to the smallest prefix whose share of the mass reaches top_p, and
// the first token whose running mass exceeds uniform * the kept mass (all sums in double).
SampledToken SampleRow(std::span<const float> logits, const RowSampling& row);

// SampleRow(logits, NextRowSampling(params, rng)).
SampledToken SampleToken(std::span<const float> logits, const SamplingParams& params, SamplerRng& rng);

}  // namespace lazykv
