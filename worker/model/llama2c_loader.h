// Loader for llama2.c "legacy" version-0 checkpoints (the format of ../shared/models).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "worker/model/model_weights.h"

namespace lazykv {

absl::StatusOr<ModelWeights> LoadLlama2cCheckpoint(const std::string& path);

}  // namespace lazykv
