// The model's weights in GPU memory for the CUDA backend: bf16 matrices, with q/k/v fused
// into one [q_dim + 2 kv_dim][dim] matrix and gate/up into one [2 hidden][dim] matrix so
// that each takes one GEMM; the norm weights stay fp32 (a few KiB, and the norm's output
// is rounded to bf16 once anyway).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model_config.h"
#include "worker/model_weights.h"

namespace lazykv {

struct DeviceLayer {
  float* attn_norm = nullptr;
  __nv_bfloat16* wqkv = nullptr;
  __nv_bfloat16* wo = nullptr;
  float* ffn_norm = nullptr;
  __nv_bfloat16* w_gate_up = nullptr;
  __nv_bfloat16* w_down = nullptr;
};

class DeviceWeights {
 public:
  ~DeviceWeights();
  DeviceWeights(const DeviceWeights&) = delete;
  DeviceWeights& operator=(const DeviceWeights&) = delete;

  // Uploads host fp32 weights, rounded to bf16 (round to nearest even).
  static absl::StatusOr<std::unique_ptr<DeviceWeights>> Upload(const ModelWeights& weights);
  // Draws synthetic weights on the GPU, bit for bit MakeSyntheticWeights(config, seed)
  // rounded to bf16, with no host copy of the model.
  static absl::StatusOr<std::unique_ptr<DeviceWeights>> Synthetic(const ModelConfig& config, uint64_t seed);

  const ModelConfig& config() const { return config_; }
  const Hash128& content_hash() const { return content_hash_; }
  const __nv_bfloat16* embedding() const { return embedding_; }
  const __nv_bfloat16* output_matrix() const { return classifier_ != nullptr ? classifier_ : embedding_; }
  const float* final_norm() const { return final_norm_; }
  const DeviceLayer& layer(int l) const { return layers_[l]; }
  uint64_t bytes() const { return bytes_; }

 private:
  explicit DeviceWeights(const ModelConfig& config) : config_(config) {}
  absl::Status Allocate();
  // Where ForEachTensor's tensor `name` lives on the device (one of the two is set).
  void Destination(const std::string& name, __nv_bfloat16** bf16, float** fp32);

  ModelConfig config_;
  Hash128 content_hash_;
  void* base_ = nullptr;
  uint64_t bytes_ = 0;
  __nv_bfloat16* embedding_ = nullptr;
  __nv_bfloat16* classifier_ = nullptr;
  float* final_norm_ = nullptr;
  std::vector<DeviceLayer> layers_;
};

}  // namespace lazykv
