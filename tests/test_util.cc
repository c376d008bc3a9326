#include "tests/test_util.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>

namespace lazykv::testing {

std::string ModelsDir() {
  std::string dir = LAZYKV_SOURCE_DIR "/../shared/models";
  if (const char* env = std::getenv("LAZYKV_MODELS_DIR"); env != nullptr && *env) dir = env;
  return std::filesystem::is_directory(dir) ? dir : "";  // absent: the tests that need it skip
}

std::string ModelPath(const std::string& file) { return ModelsDir() + "/" + file; }

std::string Llama3TokenizerDir() {
  std::filesystem::path dir = LAZYKV_SOURCE_DIR "/../shared/tokenizers/llama3";
  if (const char* env = std::getenv("LAZYKV_MODELS_DIR"); env != nullptr && *env) {
    dir = std::filesystem::path(env) / "../tokenizers/llama3";
  }
  return std::filesystem::exists(dir / "tokenizer.json") ? dir.lexically_normal().string() : "";
}

const Tokenizer* Llama3Tokenizer() {
  static const Tokenizer* tokenizer = []() -> const Tokenizer* {
    if (Llama3TokenizerDir().empty()) return nullptr;
    auto loaded = LoadTokenizer(Llama3TokenizerDir() + "/tokenizer.json");
    return loaded.ok() ? loaded->release() : nullptr;  // kept for the program's life
  }();
  return tokenizer;
}

std::vector<nlohmann::json> ReadJsonLines(const std::string& path) {
  std::vector<nlohmann::json> lines;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) lines.push_back(nlohmann::json::parse(line));
  }
  return lines;
}

bool HaveModel(const std::string& file) { return std::filesystem::exists(ModelPath(file)); }

int SlowdownFactor() {
  const char* value = std::getenv("LAZYKV_TEST_SLOWDOWN");
  const int factor = value ? std::atoi(value) : 1;
  return factor > 1 ? factor : 1;
}

uint64_t FreshSeed() {
  if (const char* fixed = std::getenv("LAZYKV_TEST_SEED"); fixed != nullptr && *fixed != '\0') {
    return std::strtoull(fixed, nullptr, 10);  // a failure's seed, to reproduce it
  }
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) ^ device();
}

std::vector<int32_t> RandomTokens(std::mt19937_64& rng, int length, int vocab_size) {
  std::uniform_int_distribution<int32_t> dist(3, vocab_size - 1);
  std::vector<int32_t> tokens(length);
  for (auto& t : tokens) t = dist(rng);
  return tokens;
}

std::vector<GenerateRequest> OverlappingRequests(const std::vector<std::vector<int32_t>>& docs, int n,
                                                 int docs_per_request, int prompt_tokens, int max_tokens,
                                                 int vocab_size, std::mt19937_64& rng) {
  std::vector<GenerateRequest> requests;
  for (int r = 0; r < n; ++r) {
    GenerateRequest request;
    for (int k = 0; k < docs_per_request; ++k) request.docs.push_back(docs[(r + k) % docs.size()]);
    request.prompt = RandomTokens(rng, prompt_tokens, vocab_size);
    request.sampling.max_tokens = max_tokens;
    requests.push_back(request);
  }
  return requests;
}

double RelativeError(const std::vector<float>& a, const std::vector<float>& reference) {
  if (a.size() != reference.size()) return INFINITY;
  double max_diff = 0, max_ref = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    // A NaN (an output never written over its poison, a partial read before it was stored) or
    // an infinity fails the comparison: std::max would skip a NaN difference.
    if (!std::isfinite(a[i]) || !std::isfinite(reference[i])) {
      if (a[i] == reference[i]) continue;  // the same infinity
      return INFINITY;
    }
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

// Inverse frequencies written out again here, not taken from the code under test
// (RopeInverseFrequencies): the plain theta^(-2i/d), and Llama 3.1's scaling as Hugging
// Face's _compute_llama3_parameters defines it.
std::vector<double> ReferenceInverseFrequencies(const RopeConfig& rope, int head_dim) {
  std::vector<double> inv;
  for (int i = 0; i < head_dim / 2; ++i) {
    const double plain = 1.0 / std::pow(rope.theta, static_cast<double>(2 * i) / head_dim);
    if (!rope.llama3_scaling) {
      inv.push_back(plain);
      continue;
    }
    const double wavelen = 2 * M_PI / plain;
    const double low_freq_wavelen = rope.original_max_position / rope.low_freq_factor;
    const double high_freq_wavelen = rope.original_max_position / rope.high_freq_factor;
    if (wavelen < high_freq_wavelen) {
      inv.push_back(plain);
    } else if (wavelen > low_freq_wavelen) {
      inv.push_back(plain / rope.scaling_factor);
    } else {
      const double smooth = (rope.original_max_position / wavelen - rope.low_freq_factor) /
                            (rope.high_freq_factor - rope.low_freq_factor);
      inv.push_back((1 - smooth) * plain / rope.scaling_factor + smooth * plain);
    }
  }
  return inv;
}

// RoPE written out from the definition, per variant.
void Rope(std::vector<double>& v, size_t offset, int head_dim, int64_t position, const RopeConfig& rope) {
  const std::vector<double> inv = ReferenceInverseFrequencies(rope, head_dim);
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
  std::vector<int64_t> positions(tokens.size());
  std::iota(positions.begin(), positions.end(), 0);
  return NaiveForwardMasked(
      w, tokens, positions, [](size_t query, size_t key) { return key <= query; },
      std::vector<bool>(tokens.size(), true));
}

std::vector<std::vector<float>> NaiveForwardMasked(const ModelWeights& w, const std::vector<int32_t>& tokens,
                                                   const std::vector<int64_t>& positions,
                                                   const std::function<bool(size_t, size_t)>& visible,
                                                   const std::vector<bool>& want_logits) {
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
      for (int h = 0; h < c.n_heads; ++h) Rope(q[t], h * hd, hd, positions[t], c.rope);
      for (int h = 0; h < c.n_kv_heads; ++h) Rope(k[t], h * hd, hd, positions[t], c.rope);
    }
    for (size_t t = 0; t < n; ++t) {
      std::vector<double> attn(c.q_dim(), 0.0);
      for (int h = 0; h < c.n_heads; ++h) {
        const size_t kvh = h / (c.n_heads / c.n_kv_heads);
        std::vector<double> scores(n, -INFINITY);
        double max_score = -INFINITY;
        for (size_t j = 0; j < n; ++j) {
          if (!visible(t, j)) continue;
          double dot = 0;
          for (size_t d = 0; d < hd; ++d) dot += q[t][h * hd + d] * k[j][kvh * hd + d];
          scores[j] = dot / std::sqrt(static_cast<double>(hd));
          max_score = std::max(max_score, scores[j]);
        }
        double sum = 0;
        for (double& s : scores) sum += s = std::exp(s - max_score);  // exp(-inf) = 0: masked
        for (size_t j = 0; j < n; ++j) {
          if (scores[j] == 0) continue;
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
    if (!want_logits[t]) continue;
    const auto out = MatVec(w.output_matrix(), Norm(x[t], w.final_norm, c.norm_eps), c.vocab_size);
    logits[t].assign(out.begin(), out.end());
  }
  return logits;
}

}  // namespace lazykv::testing
