// The model's weights in GPU memory for the CUDA backend: matrices in the backend's element
// type (bf16, or fp32 in its fp32 mode), with q/k/v fused into one [q_dim + 2 kv_dim][dim]
// matrix and gate/up into one [2 hidden][dim] matrix so that each takes one GEMM; the
// norm weights stay fp32 (a few KiB, and the norm's output is rounded once anyway).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model_config.h"
#include "kernels/cuda/element_type.h"
#include "worker/model/model_weights.h"

namespace lazykv {

// Matrices are of DeviceWeights::element(); the forward pass casts them to that type.
struct DeviceLayer {
  float* attn_norm = nullptr;
  void* wqkv = nullptr;
  void* wo = nullptr;
  float* ffn_norm = nullptr;
  void* w_gate_up = nullptr;
  void* w_down = nullptr;
};

class DeviceWeights {
 public:
  ~DeviceWeights();
  DeviceWeights(const DeviceWeights&) = delete;
  DeviceWeights& operator=(const DeviceWeights&) = delete;

  // Uploads host fp32 weights, matrices rounded to bf16 (round to nearest even) or as they are.
  static absl::StatusOr<std::unique_ptr<DeviceWeights>> Upload(const ModelWeights& weights, cuda::Element element);
  // Draws synthetic weights on the GPU, bit for bit MakeSyntheticWeights(config, seed)
  // (matrices rounded to bf16 for a bf16 element), with no host copy of the model.
  static absl::StatusOr<std::unique_ptr<DeviceWeights>> Synthetic(const ModelConfig& config, uint64_t seed,
                                                                  cuda::Element element);

  const ModelConfig& config() const { return config_; }
  const Hash128& content_hash() const { return content_hash_; }
  cuda::Element element() const { return element_; }
  const void* embedding() const { return embedding_; }
  const void* output_matrix() const { return classifier_ != nullptr ? classifier_ : embedding_; }
  const float* final_norm() const { return final_norm_; }
  const DeviceLayer& layer(int l) const { return layers_[l]; }
  uint64_t bytes() const { return bytes_; }

 private:
  DeviceWeights(const ModelConfig& config, cuda::Element element) : config_(config), element_(element) {}
  absl::Status Allocate();
  // Where ForEachTensor's tensor `name` lives on the device: a matrix (of element_) or an
  // fp32 norm weight; null when the name is unknown.
  void* Destination(const std::string& name, bool* is_matrix);

  ModelConfig config_;
  cuda::Element element_;
  Hash128 content_hash_;
  void* base_ = nullptr;
  uint64_t bytes_ = 0;
  void* embedding_ = nullptr;
  void* classifier_ = nullptr;
  float* final_norm_ = nullptr;
  std::vector<DeviceLayer> layers_;
};

}  // namespace lazykv
