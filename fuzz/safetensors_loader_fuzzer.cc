// safetensors_loader_fuzzer: the Hugging Face checkpoint loader
// (worker/model/safetensors_loader.h: ParseHfConfig, LoadHfCheckpoint), which takes a
// directory: each input becomes config.json and model.safetensors in a scratch directory.
//
// Each input is used three ways:
// - config: ParseHfConfig on the bytes as config.json text, and when they start with '{',
//   a load of them as config.json beside a valid tiny model.safetensors;
// - raw: the bytes are model.safetensors, beside a fixed tiny config.json;
// - structured: the input picks a config (tiny, or up to 3 fields set to any integer) and a
//   safetensors file written with nlohmann::json for the tiny shape: each tensor with a
//   dtype (F32, BF16, F16, or an unsupported one), its data from the input, and at most
//   one mutation (a tensor dropped, a shape or an offset changed, the header length off,
//   an extra entry), so that loading gets past the header into the tensor checks and copies.
// Invariants (abort on violation):
// - nothing throws; loading never allocates much more than the files hold (libFuzzer's
//   -malloc_limit_mb, which defaults to -rss_limit_mb, catches a config that makes it
//   allocate gigabytes next to a tiny safetensors file);
// - a config that parses is valid (ModelConfig::Validate);
// - a loaded model has the config's shape, every tensor the size the shape implies, and
//   every value is its stored element converted exactly (F32 bits; BF16 as the high half
//   of an F32; F16 by an independent reference conversion).
#include <fuzzer/FuzzedDataProvider.h>

#include <cmath>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "worker/model/safetensors_loader.h"

namespace {

using namespace lazykv;
using nlohmann::json;

constexpr size_t kMaxInputBytes = 1 << 20;

json TinyConfig(bool tied) {
  return json{{"model_type", "llama"},
              {"hidden_size", 4},
              {"intermediate_size", 6},
              {"num_hidden_layers", 1},
              {"num_attention_heads", 2},
              {"num_key_value_heads", 1},
              {"vocab_size", 5},
              {"max_position_embeddings", 16},
              {"rms_norm_eps", 1e-5},
              {"tie_word_embeddings", tied}};
}

struct Tensor {
  std::string name;
  std::vector<int64_t> shape;
};

// The tensors the loader reads for the tiny config, with their shapes.
std::vector<Tensor> TinyTensors(bool tied) {
  const int64_t dim = 4, hidden = 6, q = 4, kv = 2, vocab = 5;
  std::vector<Tensor> t = {{"model.embed_tokens.weight", {vocab, dim}},
                           {"model.layers.0.input_layernorm.weight", {dim}},
                           {"model.layers.0.self_attn.q_proj.weight", {q, dim}},
                           {"model.layers.0.self_attn.k_proj.weight", {kv, dim}},
                           {"model.layers.0.self_attn.v_proj.weight", {kv, dim}},
                           {"model.layers.0.self_attn.o_proj.weight", {dim, q}},
                           {"model.layers.0.post_attention_layernorm.weight", {dim}},
                           {"model.layers.0.mlp.gate_proj.weight", {hidden, dim}},
                           {"model.layers.0.mlp.up_proj.weight", {hidden, dim}},
                           {"model.layers.0.mlp.down_proj.weight", {dim, hidden}},
                           {"model.norm.weight", {dim}}};
  if (!tied) t.push_back({"lm_head.weight", {vocab, dim}});
  return t;
}

// IEEE half to float, written independently of the loader's HalfToFloat.
float HalfReference(uint16_t h) {
  const int sign = h >> 15, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  double v;
  if (exponent == 0) {
    v = mantissa / 1024.0 / 16384.0;  // 2^-14 * m / 2^10
  } else if (exponent == 31) {
    v = mantissa == 0 ? INFINITY : NAN;
  } else {
    v = std::ldexp(1.0 + mantissa / 1024.0, exponent - 15);
  }
  return static_cast<float>(sign ? -v : v);
}

bool SameFloat(float a, float b) { return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, 4) == 0; }

// The element of `dtype` at `data` as the loader must convert it.
float Expected(const std::string& dtype, const uint8_t* data) {
  if (dtype == "F32") {
    float f;
    std::memcpy(&f, data, 4);
    return f;
  }
  uint16_t bits;
  std::memcpy(&bits, data, 2);
  if (dtype == "BF16") {
    const uint32_t wide = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &wide, 4);
    return f;
  }
  return HalfReference(bits);
}

std::string Dir() {
  static const std::string dir = fuzz::ScratchDir() + "/model";
  static const bool made = std::filesystem::create_directories(dir) || true;
  (void)made;
  return dir;
}

// Loads the scratch directory; on success checks the weights against `tensors` (dtype
// and data of each, when the caller knows them).
void Load(const std::string& config, const std::string& safetensors,
          const std::map<std::string, std::pair<std::string, std::string>>* tensors) {
  fuzz::WriteFile(Dir() + "/config.json", config);
  fuzz::WriteFile(Dir() + "/model.safetensors", safetensors);
  absl::StatusOr<ModelWeights> w;
  try {
    w = LoadHfCheckpoint(Dir());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "LoadHfCheckpoint threw: %s\n", e.what());
    FUZZ_CHECK(false);
  }
  if (!w.ok()) {
    FUZZ_CHECK(!w.status().message().empty());
    return;
  }
  const ModelConfig& c = w->config;
  FUZZ_CHECK(c.Validate().ok());
  FUZZ_CHECK(w->layers.size() == static_cast<size_t>(c.n_layers));
  ForEachTensor(*w, [&](const std::string&, const std::vector<float>& t, size_t n) { FUZZ_CHECK(t.size() == n); });
  if (tensors == nullptr) return;
  auto check = [&](const std::string& name, const std::vector<float>& values) {
    auto it = tensors->find(name);
    FUZZ_CHECK(it != tensors->end());
    const auto& [dtype, data] = it->second;
    const size_t width = dtype == "F32" ? 4 : 2;
    FUZZ_CHECK(data.size() == values.size() * width);
    for (size_t i = 0; i < values.size(); ++i) {
      FUZZ_CHECK(SameFloat(values[i], Expected(dtype, reinterpret_cast<const uint8_t*>(data.data()) + i * width)));
    }
  };
  check("model.embed_tokens.weight", w->embedding);
  check("model.layers.0.self_attn.q_proj.weight", w->layers[0].wq);
  check("model.layers.0.mlp.down_proj.weight", w->layers[0].w_down);
  check("model.norm.weight", w->final_norm);
  if (!c.shared_classifier) check("lm_head.weight", w->classifier);
}

std::string WithHeader(const std::string& header, const std::string& data, int64_t length_delta) {
  const uint64_t length = header.size() + length_delta;
  std::string out(8, '\0');
  std::memcpy(out.data(), &length, 8);
  return out + header + data;
}

// model.safetensors for the tiny untied config, every tensor F32 zeros.
std::string TinySafetensors() {
  json header = json::object();
  uint64_t offset = 0;
  for (const Tensor& t : TinyTensors(/*tied=*/false)) {
    uint64_t count = 1;
    for (int64_t d : t.shape) count *= d;
    header[t.name] = json{{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + 4 * count}}};
    offset += 4 * count;
  }
  return WithHeader(header.dump(), std::string(offset, '\0'), 0);
}

void Structured(FuzzedDataProvider& in) {
  const bool tied = in.ConsumeBool();
  json config = TinyConfig(tied);
  for (int changes = in.ConsumeIntegralInRange<int>(-4, 3); changes > 0; --changes) {  // fields set to any integer
    static const char* const kFields[] = {"hidden_size",         "intermediate_size",   "num_hidden_layers",
                                          "num_attention_heads", "num_key_value_heads", "vocab_size",
                                          "head_dim",            "max_position_embeddings"};
    const char* field = kFields[in.ConsumeIntegralInRange<size_t>(0, std::size(kFields) - 1)];
    config[field] = in.ConsumeBool() ? in.ConsumeIntegral<int32_t>()
                                     : (int32_t{1} << in.ConsumeIntegralInRange<int>(0, 30));
  }
  static const char* const kDtypes[] = {"F32", "BF16", "F16", "F32", "I8", "F64"};
  std::vector<Tensor> tensors = TinyTensors(tied);
  const int mutation = in.ConsumeIntegralInRange<int>(0, 7);
  const size_t victim = in.ConsumeIntegralInRange<size_t>(0, tensors.size() - 1);
  const int64_t amount = in.ConsumeIntegralInRange<int64_t>(-3, 3);
  if (mutation == 1) tensors.erase(tensors.begin() + victim);

  json header = json::object();
  if (in.ConsumeBool()) header["__metadata__"] = json{{"format", "pt"}};
  std::string data;
  std::map<std::string, std::pair<std::string, std::string>> stored;
  for (size_t i = 0; i < tensors.size(); ++i) {
    Tensor& t = tensors[i];
    const std::string dtype = kDtypes[in.ConsumeIntegralInRange<size_t>(0, std::size(kDtypes) - 1)];
    int64_t count = 1;
    for (int64_t d : t.shape) count *= d;
    const size_t width = dtype == "F32" || dtype == "F64" ? (dtype == "F64" ? 8 : 4) : (dtype == "I8" ? 1 : 2);
    std::string bytes = in.ConsumeBytesAsString(count * width);
    bytes.resize(count * width, '\0');
    std::vector<int64_t> shape = t.shape;
    uint64_t begin = data.size(), end = data.size() + bytes.size();
    if (i == victim) {
      if (mutation == 2) shape.back() += amount;
      if (mutation == 3) shape.push_back(1);
      if (mutation == 4) end += amount;
      if (mutation == 5) begin += amount;
    }
    header[t.name] = json{{"dtype", dtype}, {"shape", shape}, {"data_offsets", {begin, end}}};
    stored[t.name] = {dtype, bytes};
    data += bytes;
  }
  if (mutation == 6) header["extra"] = in.ConsumeBool() ? json(in.ConsumeRandomLengthString(16)) : json::object();
  const int64_t length_delta = mutation == 7 ? amount : 0;
  // replace: the extra entry may hold invalid UTF-8, which dump() would throw on.
  const std::string header_text = header.dump(-1, ' ', false, json::error_handler_t::replace);
  Load(config.dump(), WithHeader(header_text, data, length_delta), &stored);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > kMaxInputBytes) return 0;
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  try {
    const absl::StatusOr<ModelConfig> config = ParseHfConfig(bytes, "fuzz");
    if (config.ok()) FUZZ_CHECK(config->Validate().ok());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ParseHfConfig threw: %s\n", e.what());
    FUZZ_CHECK(false);
  }
  Load(TinyConfig(false).dump(), bytes, nullptr);
  // The bytes as config.json, beside a valid tiny model.safetensors.
  static const std::string tiny = TinySafetensors();
  if (!bytes.empty() && bytes.front() == '{') Load(bytes, tiny, nullptr);
  FuzzedDataProvider in(data, size);
  Structured(in);
  return 0;
}
