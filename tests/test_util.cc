#include "tests/test_util.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>

namespace lazykv::testing {

std::string ModelsDir() {
  std::string dir = LAZYKV_SOURCE_DIR "/../shared/models";
  if (const char* env = std::getenv("LAZYKV_MODELS_DIR"); env != nullptr && *env) dir = env;
  return std::filesystem::is_directory(dir) ? dir : "";  // absent: the tests that need it skip
}

std::string ModelPath(const std::string& file) { return ModelsDir() + "/" + file; }

bool HaveModel(const std::string& file) { return std::filesystem::exists(ModelPath(file)); }

int SlowdownFactor() {
  const char* value = std::getenv("LAZYKV_TEST_SLOWDOWN");
  const int factor = value ? std::atoi(value) : 1;
  return factor > 1 ? factor : 1;
}

uint64_t FreshSeed() {
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) ^ device();
}

std::vector<int32_t> RandomTokens(std::mt19937_64& rng, int length, int vocab_size) {
  std::uniform_int_distribution<int32_t> dist(3, vocab_size - 1);
  std::vector<int32_t> tokens(length);
  for (auto& t : tokens) t = dist(rng);
  return tokens;
}

double RelativeError(const std::vector<float>& a, const std::vector<float>& reference) {
  if (a.size() != reference.size()) return INFINITY;
  double max_diff = 0, max_ref = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    max_diff = std::max(max_diff, std::abs(static_cast<double>(a[i]) - reference[i]));
    max_ref = std::max(max_ref, std::abs(static_cast<double>(reference[i])));
  }
  return max_diff / std::max(max_ref, 1e-30);
}

namespace {

// y = W x with W [out][in].
std::vector<double> MatVec(const std::vector<float>& w, const std::vector<double>& x, size_t out) {
  const size_t in = x.size();
  std::vector<double> y(out, 0.0);
  for (size_t o = 0; o < out; ++o) {
    for (size_t i = 0; i < in; ++i) y[o] += static_cast<double>(w[o * in + i]) * x[i];
  }
  return y;
}

std::vector<double> Norm(const std::vector<double>& x, const std::vector<float>& weight, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double scale = 1.0 / std::sqrt(ss / x.size() + eps);
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * scale * weight[i];
  return y;
}

// RoPE written out from the definition, per variant.
void Rope(std::vector<double>& v, size_t offset, int head_dim, int64_t position, const RopeConfig& rope) {
  const std::vector<double> inv = RopeInverseFrequencies(rope, head_dim);
  for (int i = 0; i < head_dim / 2; ++i) {
    const size_t a = rope.style == RopeStyle::kInterleaved ? offset + 2 * i : offset + i;
    const size_t b = rope.style == RopeStyle::kInterleaved ? offset + 2 * i + 1 : offset + i + head_dim / 2;
    const double angle = position * inv[i];
    const double x0 = v[a], x1 = v[b];
    v[a] = x0 * std::cos(angle) - x1 * std::sin(angle);
    v[b] = x0 * std::sin(angle) + x1 * std::cos(angle);
  }
}

}  // namespace

std::vector<std::vector<float>> NaiveForward(const ModelWeights& w, const std::vector<int32_t>& tokens) {
  const ModelConfig& c = w.config;
  const size_t n = tokens.size(), dim = c.dim, hd = c.head_dim;
  std::vector<std::vector<double>> x(n, std::vector<double>(dim));
  for (size_t t = 0; t < n; ++t) {
    for (size_t i = 0; i < dim; ++i) x[t][i] = w.embedding[tokens[t] * dim + i];
  }
  for (const LayerWeights& lw : w.layers) {
    std::vector<std::vector<double>> q(n), k(n), v(n);
    for (size_t t = 0; t < n; ++t) {
      const auto xn = Norm(x[t], lw.attn_norm, c.norm_eps);
      q[t] = MatVec(lw.wq, xn, c.q_dim());
      k[t] = MatVec(lw.wk, xn, c.kv_dim());
      v[t] = MatVec(lw.wv, xn, c.kv_dim());
      for (int h = 0; h < c.n_heads; ++h) Rope(q[t], h * hd, hd, t, c.rope);
      for (int h = 0; h < c.n_kv_heads; ++h) Rope(k[t], h * hd, hd, t, c.rope);
    }
    for (size_t t = 0; t < n; ++t) {
      std::vector<double> attn(c.q_dim(), 0.0);
      for (int h = 0; h < c.n_heads; ++h) {
        const size_t kvh = h / (c.n_heads / c.n_kv_heads);
        std::vector<double> scores(t + 1);
        double max_score = -INFINITY;
        for (size_t j = 0; j <= t; ++j) {
          double dot = 0;
          for (size_t d = 0; d < hd; ++d) dot += q[t][h * hd + d] * k[j][kvh * hd + d];
          scores[j] = dot / std::sqrt(static_cast<double>(hd));
          max_score = std::max(max_score, scores[j]);
        }
        double sum = 0;
        for (double& s : scores) sum += s = std::exp(s - max_score);
        for (size_t j = 0; j <= t; ++j) {
          for (size_t d = 0; d < hd; ++d) attn[h * hd + d] += scores[j] / sum * v[j][kvh * hd + d];
        }
      }
      const auto o = MatVec(lw.wo, attn, dim);
      for (size_t i = 0; i < dim; ++i) x[t][i] += o[i];
      const auto xn = Norm(x[t], lw.ffn_norm, c.norm_eps);
      auto gate = MatVec(lw.w_gate, xn, c.hidden_dim);
      const auto up = MatVec(lw.w_up, xn, c.hidden_dim);
      for (int i = 0; i < c.hidden_dim; ++i) gate[i] = gate[i] / (1.0 + std::exp(-gate[i])) * up[i];
      const auto down = MatVec(lw.w_down, gate, dim);
      for (size_t i = 0; i < dim; ++i) x[t][i] += down[i];
    }
  }
  std::vector<std::vector<float>> logits(n);
  for (size_t t = 0; t < n; ++t) {
    const auto out = MatVec(w.output_matrix(), Norm(x[t], w.final_norm, c.norm_eps), c.vocab_size);
    logits[t].assign(out.begin(), out.end());
  }
  return logits;
}

}  // namespace lazykv::testing
