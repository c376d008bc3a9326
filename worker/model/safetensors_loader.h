// Loader for Hugging Face Llama checkpoints: a directory with config.json and
// model.safetensors (or sharded, with model.safetensors.index.json); fp32, bf16 or fp16.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "common/model_config.h"
#include "worker/model/model_weights.h"

namespace lazykv {

// Parses a Hugging Face LlamaConfig (config.json text); `source` names it in errors.
absl::StatusOr<ModelConfig> ParseHfConfig(const std::string& json_text, const std::string& source);

absl::StatusOr<ModelWeights> LoadHfCheckpoint(const std::string& directory);

// IEEE half and bfloat16 to float (exact conversions).
float HalfToFloat(uint16_t h);
float Bfloat16ToFloat(uint16_t b);

}  // namespace lazykv
