// One entry point for every model source: a llama2.c file, a Hugging Face directory
// (config.json + safetensors), or "synthetic:NAME[:SEED]".
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "worker/model/model_weights.h"

namespace lazykv {

absl::StatusOr<ModelWeights> LoadModel(const std::string& spec);

}  // namespace lazykv
