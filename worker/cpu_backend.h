// The fp32 CPU backend: the reference implementation for every other backend.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "worker/backend.h"
#include "worker/model_weights.h"

namespace lazykv {

// Bytes of fp32 K and V one block holds across all layers (sizes the pool from a budget).
uint64_t CpuKvBytesPerBlock(const ModelConfig& config, int block_size);

absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackend(ModelWeights weights, int block_size, int num_blocks);

}  // namespace lazykv
