// Deterministic random weights of a named shape ("synthetic:NAME[:SEED]"), so that a
// machine with no checkpoint still runs everything, at realistic or tiny shapes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model_config.h"
#include "worker/model_weights.h"

namespace lazykv {

// The named shapes: tiny (llama2.c-style, interleaved RoPE), tiny-hf (rotate-half),
// tiny-llama3 (rotate-half with Llama-3 frequency scaling), small, llama3-8b.
absl::StatusOr<ModelConfig> SyntheticConfig(const std::string& name);
std::vector<std::string> SyntheticModelNames();

// Weights drawn from a counter-based generator: the same (config, seed) gives the same
// bits on every machine.
ModelWeights MakeSyntheticWeights(const ModelConfig& config, uint64_t seed);

// Parses "synthetic:NAME" or "synthetic:NAME:SEED" and builds the model.
absl::StatusOr<ModelWeights> LoadSyntheticModel(const std::string& spec);

// Bytes of fp32 weights a config needs (to refuse shapes that cannot fit in RAM).
uint64_t Fp32WeightBytes(const ModelConfig& config);

}  // namespace lazykv
