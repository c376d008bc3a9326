#include "worker/backend/cuda_weights.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "kernels/cuda/model_ops.h"
#include "spdlog/spdlog.h"
#include "worker/backend/cuda_backend_internal.h"
#include "worker/model/synthetic_model.h"

namespace lazykv {
namespace {

using cuda_backend::Cuda;

size_t Align(size_t bytes) { return (bytes + 255) / 256 * 256; }

// Tensor names and element counts in ForEachTensor order, without allocating the model.
std::vector<std::pair<std::string, size_t>> TensorList(const ModelConfig& config) {
  ModelWeights shape;
  shape.config = config;
  shape.layers.resize(config.n_layers);
  std::vector<std::pair<std::string, size_t>> list;
  ForEachTensor(shape, [&](const std::string& name, std::vector<float>&, size_t n) { list.emplace_back(name, n); });
  return list;
}

}  // namespace

DeviceWeights::~DeviceWeights() {
  if (base_ != nullptr) cudaFree(base_);
}

absl::Status DeviceWeights::Allocate() {
  const ModelConfig& c = config_;
  const size_t dim = c.dim, q = c.q_dim(), kv = c.kv_dim(), hidden = c.hidden_dim, vocab = c.vocab_size;
  const size_t m = cuda::ElementBytes(element_), fp = sizeof(float);
  const size_t per_layer = 2 * Align(dim * fp) + Align((q + 2 * kv) * dim * m) + Align(dim * q * m) +
                           Align(2 * hidden * dim * m) + Align(dim * hidden * m);
  bytes_ = Align(vocab * dim * m) * (c.shared_classifier ? 1 : 2) + Align(dim * fp) + per_layer * c.n_layers;
  if (cudaError_t e = cudaMalloc(&base_, bytes_); e != cudaSuccess) {
    return absl::ResourceExhaustedError(absl::StrFormat("%.2f GiB of %s weights on the GPU: %s", bytes_ / 1073741824.0,
                                                        cuda::ElementName(element_), cudaGetErrorString(e)));
  }
  char* next = static_cast<char*>(base_);
  auto take = [&](size_t bytes) {
    char* p = next;
    next += Align(bytes);
    return p;
  };
  embedding_ = take(vocab * dim * m);
  if (!c.shared_classifier) classifier_ = take(vocab * dim * m);
  final_norm_ = reinterpret_cast<float*>(take(dim * fp));
  layers_.resize(c.n_layers);
  for (DeviceLayer& l : layers_) {
    l.attn_norm = reinterpret_cast<float*>(take(dim * fp));
    l.ffn_norm = reinterpret_cast<float*>(take(dim * fp));
    l.wqkv = take((q + 2 * kv) * dim * m);
    l.wo = take(dim * q * m);
    l.w_gate_up = take(2 * hidden * dim * m);
    l.w_down = take(dim * hidden * m);
  }
  return absl::OkStatus();
}

void* DeviceWeights::Destination(const std::string& name, bool* is_matrix) {
  const size_t dim = config_.dim, q = config_.q_dim(), kv = config_.kv_dim(), hidden = config_.hidden_dim;
  const size_t m = cuda::ElementBytes(element_);
  auto at = [m](void* matrix, size_t elements) { return static_cast<char*>(matrix) + elements * m; };
  *is_matrix = true;
  if (name == "embedding") return embedding_;
  if (name == "classifier") return classifier_;
  *is_matrix = false;
  if (name == "final_norm") return final_norm_;
  // "layers.L.NAME"
  std::vector<std::string> parts = absl::StrSplit(name, '.');
  int l = 0;
  if (parts.size() != 3 || !absl::SimpleAtoi(parts[1], &l) || l < 0 || l >= config_.n_layers) return nullptr;
  DeviceLayer& layer = layers_[l];
  const std::string& t = parts[2];
  if (t == "attn_norm") return layer.attn_norm;
  if (t == "ffn_norm") return layer.ffn_norm;
  *is_matrix = true;
  if (t == "wq") return layer.wqkv;
  if (t == "wk") return at(layer.wqkv, q * dim);
  if (t == "wv") return at(layer.wqkv, (q + kv) * dim);
  if (t == "wo") return layer.wo;
  if (t == "w_gate") return layer.w_gate_up;
  if (t == "w_up") return at(layer.w_gate_up, hidden * dim);
  if (t == "w_down") return layer.w_down;
  return nullptr;
}

absl::StatusOr<std::unique_ptr<DeviceWeights>> DeviceWeights::Upload(const ModelWeights& weights,
                                                                     cuda::Element element) {
  std::unique_ptr<DeviceWeights> d(new DeviceWeights(weights.config, element));
  if (absl::Status s = d->Allocate(); !s.ok()) return s;
  d->content_hash_ = weights.content_hash;
  absl::Status status;
  std::vector<__nv_bfloat16> staging;
  ForEachTensor(weights, [&](const std::string& name, const std::vector<float>& t, size_t) {
    if (!status.ok()) return;
    bool is_matrix = false;
    void* dst = d->Destination(name, &is_matrix);
    if (dst == nullptr) {
      status = absl::InternalError(absl::StrFormat("no device place for tensor %s", name));
    } else if (!is_matrix || element == cuda::Element::kFp32) {
      status = Cuda(cudaMemcpy(dst, t.data(), t.size() * sizeof(float), cudaMemcpyHostToDevice), "upload");
    } else {
      staging.resize(t.size());
      for (size_t i = 0; i < t.size(); ++i) staging[i] = __float2bfloat16(t[i]);
      status =
          Cuda(cudaMemcpy(dst, staging.data(), t.size() * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice), "upload");
    }
  });
  if (!status.ok()) return status;
  return d;
}

absl::StatusOr<std::unique_ptr<DeviceWeights>> DeviceWeights::Synthetic(const ModelConfig& config, uint64_t seed,
                                                                        cuda::Element element) {
  if (absl::Status s = config.Validate(); !s.ok()) return s;
  std::unique_ptr<DeviceWeights> d(new DeviceWeights(config, element));
  if (absl::Status s = d->Allocate(); !s.ok()) return s;
  d->content_hash_ = SyntheticContentHash(config, seed);
  uint64_t index = 0;
  for (const auto& [name, n] : TensorList(config)) {
    const SyntheticTensorDraw draw = SyntheticDrawFor(config, seed, name, ++index);
    bool is_matrix = false;
    void* dst = d->Destination(name, &is_matrix);
    if (dst == nullptr) return absl::InternalError(absl::StrFormat("no device place for %s", name));
    const bool bf16 = is_matrix && element == cuda::Element::kBf16;
    __nv_bfloat16* out_bf16 = bf16 ? static_cast<__nv_bfloat16*>(dst) : nullptr;
    float* out_fp32 = bf16 ? nullptr : static_cast<float*>(dst);
    if (absl::Status s =
            Cuda(cuda::LaunchSyntheticFill(draw.state, n, draw.scale, draw.is_norm, out_bf16, out_fp32, nullptr),
                 "synthetic fill");
        !s.ok()) {
      return s;
    }
  }
  if (absl::Status s = Cuda(cudaDeviceSynchronize(), "synthetic weights"); !s.ok()) return s;
  spdlog::info("synthetic weights drawn on the GPU: {:.2f} GiB {}", d->bytes_ / 1073741824.0,
               cuda::ElementName(element));
  return d;
}

}  // namespace lazykv
