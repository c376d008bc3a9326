// Deterministic random weights of a named shape ("synthetic:NAME[:SEED]"), so that a
// machine with no checkpoint still runs everything, at realistic or tiny shapes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model_config.h"
#include "worker/model/model_weights.h"

namespace lazykv {

// The named shapes: tiny (llama2.c-style, interleaved RoPE), tiny-hf (rotate-half),
// tiny-llama3 (rotate-half with Llama-3 frequency scaling), small, llama3-8b.
absl::StatusOr<ModelConfig> SyntheticConfig(const std::string& name);
std::vector<std::string> SyntheticModelNames();

// Weights drawn from a counter-based generator: the same (config, seed) gives the same
// bits on every machine.
ModelWeights MakeSyntheticWeights(const ModelConfig& config, uint64_t seed);

// How MakeSyntheticWeights draws one tensor (the `index`-th in ForEachTensor order, from
// 1): SplitMix64Unit from `state`, times `scale` (norms: 1 + 0.1 * ...). The GPU backend
// draws the same bits on the device.
struct SyntheticTensorDraw {
  uint64_t state = 0;
  float scale = 1.0f;
  bool is_norm = false;
};
SyntheticTensorDraw SyntheticDrawFor(const ModelConfig& config, uint64_t seed, const std::string& name, uint64_t index);
// The content hash MakeSyntheticWeights gives (config and seed; no pass over the weights).
Hash128 SyntheticContentHash(const ModelConfig& config, uint64_t seed);

struct SyntheticSpec {
  ModelConfig config;
  uint64_t seed = 0;
};
// Parses "synthetic:NAME" or "synthetic:NAME:SEED" without building any weights.
absl::StatusOr<SyntheticSpec> ParseSyntheticSpec(const std::string& spec);

// Parses "synthetic:NAME" or "synthetic:NAME:SEED" and builds the model.
absl::StatusOr<ModelWeights> LoadSyntheticModel(const std::string& spec);

// Bytes of fp32 weights a config needs (to refuse shapes that cannot fit in RAM).
uint64_t Fp32WeightBytes(const ModelConfig& config);

}  // namespace lazykv
