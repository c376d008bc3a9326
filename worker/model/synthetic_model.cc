#include "worker/model/synthetic_model.h"

#include <unistd.h>

#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/splitmix64.h"

namespace lazykv {
namespace {

// Uniform in [-1, 1).
float UniformSigned(uint64_t& state) { return static_cast<float>(SplitMix64Unit(state) * 2.0 - 1.0); }

ModelConfig TinyBase(const std::string& name) {
  ModelConfig c;
  c.name = "synthetic:" + name;
  c.dim = 64;
  c.hidden_dim = 172;
  c.n_layers = 4;
  c.n_heads = 8;
  c.n_kv_heads = 4;
  c.head_dim = 8;
  c.vocab_size = 512;
  c.max_seq_len = 4096;
  return c;
}

}  // namespace

std::vector<std::string> SyntheticModelNames() {
  return {"tiny", "tiny-hf", "tiny-llama3", "tiny-llama3-vocab", "small", "llama3-8b"};
}

absl::StatusOr<ModelConfig> SyntheticConfig(const std::string& name) {
  if (name == "tiny") return TinyBase(name);
  if (name == "tiny-hf") {
    ModelConfig c = TinyBase(name);
    c.rope.style = RopeStyle::kRotateHalf;
    c.shared_classifier = false;
    return c;
  }
  if (name == "tiny-llama3") {
    // Small enough for tests, with frequencies on every branch of the Llama-3 scaling.
    ModelConfig c = TinyBase(name);
    c.rope.style = RopeStyle::kRotateHalf;
    c.rope.theta = 500000.0;
    c.rope.llama3_scaling = true;
    c.rope.original_max_position = 8192.0;
    c.head_dim = 16;
    c.n_heads = 4;
    c.n_kv_heads = 1;
    c.shared_classifier = false;
    return c;
  }
  if (name == "tiny-llama3-vocab") {
    // tiny-llama3 with Llama 3's vocabulary and special ids: serves real Llama 3 text
    // (the tokenizer.json and chat template) on the CPU in tests.
    ModelConfig c = *SyntheticConfig("tiny-llama3");
    c.name = "synthetic:" + name;
    c.vocab_size = 128256;
    c.bos_id = 128000;
    c.eos_id = 128001;
    c.other_eos_ids = {128009};
    return c;
  }
  if (name == "small") {
    ModelConfig c = TinyBase(name);
    c.dim = 512;
    c.hidden_dim = 1408;
    c.n_layers = 6;
    c.n_heads = 8;
    c.n_kv_heads = 2;
    c.head_dim = 64;
    c.vocab_size = 4096;
    c.rope.style = RopeStyle::kRotateHalf;
    return c;
  }
  if (name == "llama3-8b") {
    ModelConfig c;
    c.name = "synthetic:llama3-8b";
    c.dim = 4096;
    c.hidden_dim = 14336;
    c.n_layers = 32;
    c.n_heads = 32;
    c.n_kv_heads = 8;
    c.head_dim = 128;
    c.vocab_size = 128256;
    c.max_seq_len = 131072;
    c.norm_eps = 1e-5f;
    c.rope.style = RopeStyle::kRotateHalf;
    c.rope.theta = 500000.0;
    c.rope.llama3_scaling = true;
    c.shared_classifier = false;
    c.bos_id = 128000;
    c.eos_id = 128001;
    return c;
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("unknown synthetic model '%s'; known: %s", name, absl::StrJoin(SyntheticModelNames(), ", ")));
}

uint64_t Fp32WeightBytes(const ModelConfig& c) {
  const uint64_t dim = c.dim, hidden = c.hidden_dim, q = c.q_dim(), kv = c.kv_dim(), vocab = c.vocab_size;
  const uint64_t per_layer = 2 * dim + 2 * q * dim + 2 * kv * dim + 3 * hidden * dim;
  return 4 * (vocab * dim * (c.shared_classifier ? 1 : 2) + c.n_layers * per_layer + dim);
}

SyntheticTensorDraw SyntheticDrawFor(const ModelConfig& config, uint64_t seed, const std::string& name,
                                     uint64_t index) {
  SyntheticTensorDraw draw;
  draw.state = seed * 0x2545f4914f6cdd1dULL + index * 0x9e3779b97f4a7c15ULL;
  draw.is_norm = name.ends_with("norm");
  // Uniform(-a, a) has variance a^2/3: a = sqrt(3 / fan_in) keeps activations at unit scale.
  const size_t fan_in = name.ends_with("wo")       ? config.q_dim()
                        : name.ends_with("w_down") ? config.hidden_dim
                                                   : config.dim;
  draw.scale = name == "embedding" ? 1.0f : std::sqrt(3.0f / static_cast<float>(fan_in));
  return draw;
}

Hash128 SyntheticContentHash(const ModelConfig& config, uint64_t seed) {
  Hasher128 hasher;
  hasher.AddString("lazykv.synthetic.v1");
  config.HashInto(hasher);
  hasher.AddU64(seed);
  return hasher.Finish();
}

ModelWeights MakeSyntheticWeights(const ModelConfig& config, uint64_t seed) {
  ModelWeights w = AllocateWeights(config);
  uint64_t tensor_index = 0;
  ForEachTensor(w, [&](const std::string& name, std::vector<float>& t, size_t) {
    SyntheticTensorDraw draw = SyntheticDrawFor(config, seed, name, ++tensor_index);
    for (float& v : t) {
      v = draw.is_norm ? 1.0f + 0.1f * UniformSigned(draw.state) : draw.scale * UniformSigned(draw.state);
    }
  });
  w.content_hash = SyntheticContentHash(config, seed);
  return w;
}

absl::StatusOr<SyntheticSpec> ParseSyntheticSpec(const std::string& spec) {
  std::vector<std::string> parts = absl::StrSplit(spec, ':');
  if (parts.size() < 2 || parts.size() > 3 || parts[0] != "synthetic") {
    return absl::InvalidArgumentError(absl::StrFormat("model '%s': expected synthetic:NAME[:SEED]", spec));
  }
  auto config = SyntheticConfig(parts[1]);
  if (!config.ok()) return config.status();
  SyntheticSpec out{*config, 0};
  if (parts.size() == 3 && !absl::SimpleAtoi(parts[2], &out.seed)) {
    return absl::InvalidArgumentError(absl::StrFormat("model '%s': seed '%s' is not a number", spec, parts[2]));
  }
  return out;
}

absl::StatusOr<ModelWeights> LoadSyntheticModel(const std::string& spec) {
  auto parsed = ParseSyntheticSpec(spec);
  if (!parsed.ok()) return parsed.status();
  const uint64_t need = Fp32WeightBytes(parsed->config);
  const uint64_t have = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(sysconf(_SC_PAGE_SIZE));
  if (need > have / 2) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "model '%s' needs %.1f GiB of fp32 weights on the CPU backend, more than half of this machine's %.1f GiB "
        "(the CUDA backend builds synthetic weights on the GPU: --device cuda)",
        spec, need / 1073741824.0, have / 1073741824.0));
  }
  return MakeSyntheticWeights(parsed->config, parsed->seed);
}

}  // namespace lazykv
