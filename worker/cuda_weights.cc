#include "worker/cuda_weights.h"

#include <cuda_runtime.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "kernels/cuda/model_ops.h"
#include "spdlog/spdlog.h"
#include "worker/synthetic_model.h"

namespace lazykv {
namespace {

absl::Status CudaStatus(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  const auto code = e == cudaErrorMemoryAllocation ? absl::StatusCode::kResourceExhausted : absl::StatusCode::kInternal;
  return absl::Status(code, absl::StrFormat("%s: %s", what, cudaGetErrorString(e)));
}

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
  const size_t bf = sizeof(__nv_bfloat16), fp = sizeof(float);
  const size_t per_layer = 2 * Align(dim * fp) + Align((q + 2 * kv) * dim * bf) + Align(dim * q * bf) +
                           Align(2 * hidden * dim * bf) + Align(dim * hidden * bf);
  bytes_ = Align(vocab * dim * bf) * (c.shared_classifier ? 1 : 2) + Align(dim * fp) + per_layer * c.n_layers;
  if (cudaError_t e = cudaMalloc(&base_, bytes_); e != cudaSuccess) {
    return absl::ResourceExhaustedError(absl::StrFormat("%.2f GiB of bf16 weights on the GPU: %s",
                                                        bytes_ / 1073741824.0, cudaGetErrorString(e)));
  }
  char* next = static_cast<char*>(base_);
  auto take = [&](size_t bytes) {
    char* p = next;
    next += Align(bytes);
    return p;
  };
  embedding_ = reinterpret_cast<__nv_bfloat16*>(take(vocab * dim * bf));
  if (!c.shared_classifier) classifier_ = reinterpret_cast<__nv_bfloat16*>(take(vocab * dim * bf));
  final_norm_ = reinterpret_cast<float*>(take(dim * fp));
  layers_.resize(c.n_layers);
  for (DeviceLayer& l : layers_) {
    l.attn_norm = reinterpret_cast<float*>(take(dim * fp));
    l.ffn_norm = reinterpret_cast<float*>(take(dim * fp));
    l.wqkv = reinterpret_cast<__nv_bfloat16*>(take((q + 2 * kv) * dim * bf));
    l.wo = reinterpret_cast<__nv_bfloat16*>(take(dim * q * bf));
    l.w_gate_up = reinterpret_cast<__nv_bfloat16*>(take(2 * hidden * dim * bf));
    l.w_down = reinterpret_cast<__nv_bfloat16*>(take(dim * hidden * bf));
  }
  return absl::OkStatus();
}

void DeviceWeights::Destination(const std::string& name, __nv_bfloat16** bf16, float** fp32) {
  *bf16 = nullptr;
  *fp32 = nullptr;
  const size_t dim = config_.dim, q = config_.q_dim(), kv = config_.kv_dim(), hidden = config_.hidden_dim;
  if (name == "embedding") { *bf16 = embedding_; return; }
  if (name == "classifier") { *bf16 = classifier_; return; }
  if (name == "final_norm") { *fp32 = final_norm_; return; }
  // "layers.L.NAME"
  std::vector<std::string> parts = absl::StrSplit(name, '.');
  int l = 0;
  if (parts.size() != 3 || !absl::SimpleAtoi(parts[1], &l)) return;
  DeviceLayer& layer = layers_[l];
  const std::string& t = parts[2];
  if (t == "attn_norm") *fp32 = layer.attn_norm;
  if (t == "ffn_norm") *fp32 = layer.ffn_norm;
  if (t == "wq") *bf16 = layer.wqkv;
  if (t == "wk") *bf16 = layer.wqkv + q * dim;
  if (t == "wv") *bf16 = layer.wqkv + (q + kv) * dim;
  if (t == "wo") *bf16 = layer.wo;
  if (t == "w_gate") *bf16 = layer.w_gate_up;
  if (t == "w_up") *bf16 = layer.w_gate_up + hidden * dim;
  if (t == "w_down") *bf16 = layer.w_down;
}

absl::StatusOr<std::unique_ptr<DeviceWeights>> DeviceWeights::Upload(const ModelWeights& weights) {
  std::unique_ptr<DeviceWeights> d(new DeviceWeights(weights.config));
  if (absl::Status s = d->Allocate(); !s.ok()) return s;
  d->content_hash_ = weights.content_hash;
  absl::Status status;
  std::vector<__nv_bfloat16> staging;
  ForEachTensor(weights, [&](const std::string& name, const std::vector<float>& t, size_t) {
    if (!status.ok()) return;
    __nv_bfloat16* bf = nullptr;
    float* fp = nullptr;
    d->Destination(name, &bf, &fp);
    if (fp != nullptr) {
      status = CudaStatus(cudaMemcpy(fp, t.data(), t.size() * sizeof(float), cudaMemcpyHostToDevice), "upload");
    } else if (bf != nullptr) {
      staging.resize(t.size());
      for (size_t i = 0; i < t.size(); ++i) staging[i] = __float2bfloat16(t[i]);
      status = CudaStatus(cudaMemcpy(bf, staging.data(), t.size() * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice),
                          "upload");
    } else {
      status = absl::InternalError(absl::StrFormat("no device place for tensor %s", name));
    }
  });
  if (!status.ok()) return status;
  return d;
}

absl::StatusOr<std::unique_ptr<DeviceWeights>> DeviceWeights::Synthetic(const ModelConfig& config, uint64_t seed) {
  if (absl::Status s = config.Validate(); !s.ok()) return s;
  std::unique_ptr<DeviceWeights> d(new DeviceWeights(config));
  if (absl::Status s = d->Allocate(); !s.ok()) return s;
  d->content_hash_ = SyntheticContentHash(config, seed);
  uint64_t index = 0;
  for (const auto& [name, n] : TensorList(config)) {
    const SyntheticTensorDraw draw = SyntheticDrawFor(config, seed, name, ++index);
    __nv_bfloat16* bf = nullptr;
    float* fp = nullptr;
    d->Destination(name, &bf, &fp);
    if (bf == nullptr && fp == nullptr) return absl::InternalError(absl::StrFormat("no device place for %s", name));
    if (absl::Status s = CudaStatus(cuda::LaunchSyntheticFill(draw.state, n, draw.scale, draw.is_norm, bf, fp, nullptr),
                                    "synthetic fill");
        !s.ok()) {
      return s;
    }
  }
  if (absl::Status s = CudaStatus(cudaDeviceSynchronize(), "synthetic weights"); !s.ok()) return s;
  spdlog::info("synthetic weights drawn on the GPU: {:.2f} GiB bf16", d->bytes_ / 1073741824.0);
  return d;
}

}  // namespace lazykv
