// fp32 weights of a Llama-family model in PyTorch layout: every matrix is row-major
// [out_features][in_features], as in llama2.c and Hugging Face checkpoints.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/chunk_key.h"
#include "common/model_config.h"

namespace lazykv {

struct LayerWeights {
  std::vector<float> attn_norm;  // [dim]
  std::vector<float> wq;         // [n_heads * head_dim][dim]
  std::vector<float> wk;         // [n_kv_heads * head_dim][dim]
  std::vector<float> wv;         // [n_kv_heads * head_dim][dim]
  std::vector<float> wo;         // [dim][n_heads * head_dim]
  std::vector<float> ffn_norm;   // [dim]
  std::vector<float> w_gate;     // [hidden][dim]   (llama2.c w1)
  std::vector<float> w_down;     // [dim][hidden]   (llama2.c w2)
  std::vector<float> w_up;       // [hidden][dim]   (llama2.c w3)
};

struct ModelWeights {
  ModelConfig config;
  std::vector<float> embedding;  // [vocab][dim]
  std::vector<LayerWeights> layers;
  std::vector<float> final_norm;  // [dim]
  std::vector<float> classifier;  // [vocab][dim]; empty when shared with the embedding
  // Identifies these exact weights; part of the model fingerprint (DESIGN.md section 3).
  Hash128 content_hash;

  const std::vector<float>& output_matrix() const { return config.shared_classifier ? embedding : classifier; }
};

// Allocates every tensor at the shape the config implies (zero-filled).
ModelWeights AllocateWeights(const ModelConfig& config);

// Hashes the config and every tensor in a fixed order.
Hash128 HashWeights(const ModelWeights& weights);

// Calls fn(name, tensor, expected_element_count) for every tensor, in canonical order.
template <typename Weights, typename Fn>
void ForEachTensor(Weights& w, Fn&& fn) {
  const ModelConfig& c = w.config;
  const size_t dim = c.dim, hidden = c.hidden_dim, q = c.q_dim(), kv = c.kv_dim(), vocab = c.vocab_size;
  fn("embedding", w.embedding, vocab * dim);
  for (size_t l = 0; l < w.layers.size(); ++l) {
    auto& layer = w.layers[l];
    const std::string p = "layers." + std::to_string(l) + ".";
    fn(p + "attn_norm", layer.attn_norm, dim);
    fn(p + "wq", layer.wq, q * dim);
    fn(p + "wk", layer.wk, kv * dim);
    fn(p + "wv", layer.wv, kv * dim);
    fn(p + "wo", layer.wo, dim * q);
    fn(p + "ffn_norm", layer.ffn_norm, dim);
    fn(p + "w_gate", layer.w_gate, hidden * dim);
    fn(p + "w_down", layer.w_down, dim * hidden);
    fn(p + "w_up", layer.w_up, hidden * dim);
  }
  fn("final_norm", w.final_norm, dim);
  if (!c.shared_classifier) fn("classifier", w.classifier, vocab * dim);
}

}  // namespace lazykv
