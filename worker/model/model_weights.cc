#include "worker/model/model_weights.h"

namespace lazykv {

ModelWeights AllocateWeights(const ModelConfig& config) {
  ModelWeights w;
  w.config = config;
  w.layers.resize(config.n_layers);
  ForEachTensor(w, [](const std::string&, std::vector<float>& t, size_t n) { t.assign(n, 0.0f); });
  return w;
}

Hash128 HashWeights(const ModelWeights& weights) {
  Hasher128 hasher;
  hasher.AddString("lazykv.weights.v1");
  weights.config.HashInto(hasher);
  ForEachTensor(weights, [&](const std::string& name, const std::vector<float>& t, size_t) {
    hasher.AddString(name).AddU64(t.size()).AddRaw(t.data(), t.size() * sizeof(float));
  });
  return hasher.Finish();
}

}  // namespace lazykv
