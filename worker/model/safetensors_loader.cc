#include "worker/model/safetensors_loader.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/mapped_file.h"
#include "common/status_macros.h"
#include "kernels/cpu/bf16.h"

namespace lazykv {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

struct TensorView {
  std::string dtype;
  std::vector<int64_t> shape;
  std::span<const uint8_t> data;
  const std::string* file;
};

// One mapped safetensors file and the index of its tensors.
struct SafetensorsFile {
  MappedFile mapped;
  std::map<std::string, TensorView> tensors;
};

// A JSON integer that T holds, or nothing (a float, even a whole one, or an integer out of
// T's range: a cast of those would be undefined or would wrap).
template <typename T>
std::optional<T> IntegerOf(const json& v) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (std::in_range<T>(u)) return static_cast<T>(u);
  } else if (v.is_number_integer()) {
    const int64_t i = v.get<int64_t>();
    if (std::in_range<T>(i)) return static_cast<T>(i);
  }
  return std::nullopt;
}

// A JSON array of such integers, or nothing.
template <typename T>
std::optional<std::vector<T>> IntegersOf(const json& v) {
  if (!v.is_array()) return std::nullopt;
  std::vector<T> out;
  for (const json& e : v) {
    const std::optional<T> i = IntegerOf<T>(e);
    if (!i) return std::nullopt;
    out.push_back(*i);
  }
  return out;
}

size_t DtypeSize(const std::string& dtype) {
  if (dtype == "F32") return 4;
  if (dtype == "BF16" || dtype == "F16") return 2;
  return 0;
}

absl::Status ParseSafetensors(SafetensorsFile& file) {
  const std::string& path = file.mapped.path();
  auto bad = [&](const std::string& what) { return absl::InvalidArgumentError(absl::StrFormat("%s: %s", path, what)); };
  const auto bytes = file.mapped.bytes();
  if (bytes.size() < 8) return bad("truncated: no safetensors header length");
  uint64_t header_len;
  std::memcpy(&header_len, bytes.data(), 8);
  if (header_len > bytes.size() - 8) {
    return bad(absl::StrFormat("truncated: header length %d exceeds the file (%d bytes)", header_len, bytes.size()));
  }
  json header = json::parse(bytes.begin() + 8, bytes.begin() + 8 + header_len, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) return bad("safetensors header is not a JSON object");
  const auto data = bytes.subspan(8 + header_len);
  for (auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") || !entry.contains("data_offsets")) {
      return bad(absl::StrCat("tensor ", name, ": entry lacks dtype, shape or data_offsets"));
    }
    TensorView view;
    view.file = &path;
    try {
      view.dtype = entry["dtype"].get<std::string>();
      std::optional<std::vector<int64_t>> shape = IntegersOf<int64_t>(entry["shape"]);
      if (!shape) return bad(absl::StrCat("tensor ", name, ": shape is not a list of integers"));
      view.shape = *std::move(shape);
      const std::optional<std::vector<uint64_t>> listed = IntegersOf<uint64_t>(entry["data_offsets"]);
      if (!listed) return bad(absl::StrCat("tensor ", name, ": data_offsets is not a list of integers"));
      const std::vector<uint64_t>& offsets = *listed;
      if (offsets.size() != 2 || offsets[0] > offsets[1] || offsets[1] > data.size()) {
        return bad(absl::StrFormat("tensor %s: data_offsets outside the file's %d data bytes (truncated?)", name,
                                   data.size()));
      }
      view.data = data.subspan(offsets[0], offsets[1] - offsets[0]);
    } catch (const json::exception& e) {
      return bad(absl::StrCat("tensor ", name, ": ", e.what()));
    }
    file.tensors.emplace(name, view);
  }
  return absl::OkStatus();
}

absl::Status CopyTensor(const TensorView& t, const std::string& name, std::vector<int64_t> expected_shape,
                        std::vector<float>& dst) {
  auto shape_string = [](const std::vector<int64_t>& s) {
    std::string out = "[";
    for (size_t i = 0; i < s.size(); ++i) absl::StrAppend(&out, i ? ", " : "", s[i]);
    return out + "]";
  };
  if (t.shape != expected_shape) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: tensor %s has shape %s, the config implies %s", *t.file,
                                                      name, shape_string(t.shape), shape_string(expected_shape)));
  }
  const size_t elem = DtypeSize(t.dtype);
  if (elem == 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: tensor %s has dtype %s; supported are F32, BF16, F16", *t.file, name, t.dtype));
  }
  if (t.data.size() != dst.size() * elem) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: tensor %s holds %d bytes, its shape needs %d", *t.file, name,
                                                      t.data.size(), dst.size() * elem));
  }
  const uint8_t* src = t.data.data();
  if (t.dtype == "F32") {
    std::memcpy(dst.data(), src, t.data.size());
  } else {
    for (size_t i = 0; i < dst.size(); ++i) {
      uint16_t v;
      std::memcpy(&v, src + 2 * i, 2);
      dst[i] = t.dtype == "BF16" ? Bfloat16ToFloat(v) : HalfToFloat(v);
    }
  }
  return absl::OkStatus();
}

// A config number as an int, when it is one: a JSON integer, or a float without a fraction
// (Python may write 4096.0), within int's range. A cast of anything else (1e30, say) would be
// undefined behaviour, so it is refused.
std::optional<int> AsInt(const json& v) {
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (d >= std::numeric_limits<int>::min() && d <= std::numeric_limits<int>::max() && d == std::trunc(d)) {
      return static_cast<int>(d);
    }
    return std::nullopt;
  }
  return IntegerOf<int>(v);
}

// A config number as a float: finite and within float's range (a narrower cast is undefined).
std::optional<float> AsFloat(const json& v) {
  if (!v.is_number()) return std::nullopt;
  const double d = v.get<double>();
  if (!std::isfinite(d) || std::fabs(d) > std::numeric_limits<float>::max()) return std::nullopt;
  return static_cast<float>(d);
}

}  // namespace

float Bfloat16ToFloat(uint16_t b) { return cpu::Bf16BitsToFloat(b); }

float HalfToFloat(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  float value;
  if (exponent == 0) {
    value = std::ldexp(static_cast<float>(mantissa), -24);  // zero and subnormals
  } else if (exponent == 31) {
    value = mantissa == 0 ? INFINITY : NAN;
  } else {
    value = std::ldexp(static_cast<float>(mantissa | 0x400), static_cast<int>(exponent) - 25);
  }
  return sign ? -value : value;
}

absl::StatusOr<ModelConfig> ParseHfConfig(const std::string& json_text, const std::string& source) {
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: %s", source, what));
  };
  json cfg = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (cfg.is_discarded() || !cfg.is_object()) return bad("not a JSON object");
  ModelConfig c;
  c.name = source;
  // The first field that is not a number of its type (checked below, after the reads).
  std::string bad_field;
  auto int_value = [&](const json& v, const char* field) {
    const std::optional<int> i = AsInt(v);
    if (!i && bad_field.empty()) bad_field = field;
    return i.value_or(0);
  };
  auto int_or = [&](const char* field, int fallback) {
    return cfg.contains(field) && !cfg[field].is_null() ? int_value(cfg[field], field) : fallback;
  };
  try {
    const std::string model_type = cfg.value("model_type", "llama");
    if (model_type != "llama") return bad(absl::StrCat("model_type '", model_type, "' is not supported (llama only)"));
    for (const char* field :
         {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size"}) {
      if (!cfg.contains(field)) return bad(absl::StrCat("missing field ", field));
    }
    c.dim = int_value(cfg["hidden_size"], "hidden_size");
    c.hidden_dim = int_value(cfg["intermediate_size"], "intermediate_size");
    c.n_layers = int_value(cfg["num_hidden_layers"], "num_hidden_layers");
    c.n_heads = int_value(cfg["num_attention_heads"], "num_attention_heads");
    c.n_kv_heads = int_or("num_key_value_heads", c.n_heads);
    c.vocab_size = int_value(cfg["vocab_size"], "vocab_size");
    c.head_dim = int_or("head_dim", c.n_heads > 0 ? c.dim / c.n_heads : 0);
    c.max_seq_len = int_or("max_position_embeddings", 2048);
    if (cfg.contains("rms_norm_eps") && !cfg["rms_norm_eps"].is_null()) {
      const std::optional<float> eps = AsFloat(cfg["rms_norm_eps"]);
      if (!eps) return bad("rms_norm_eps is not a finite number within float's range");
      c.norm_eps = *eps;
    } else {
      c.norm_eps = 1e-6f;
    }
    c.rope.style = RopeStyle::kRotateHalf;
    c.rope.theta = cfg.value("rope_theta", 10000.0);
    c.shared_classifier = cfg.value("tie_word_embeddings", false);
    auto first_id = [&](const char* field, int fallback) {
      if (!cfg.contains(field) || cfg[field].is_null()) return fallback;
      const json& v = cfg[field];
      return v.is_array() ? (v.empty() ? fallback : int_value(v[0], field)) : int_value(v, field);
    };
    c.bos_id = first_id("bos_token_id", 1);
    c.eos_id = first_id("eos_token_id", 2);
    if (cfg.contains("eos_token_id") && cfg["eos_token_id"].is_array()) {
      for (size_t i = 1; i < cfg["eos_token_id"].size(); ++i) {
        c.other_eos_ids.push_back(int_value(cfg["eos_token_id"][i], "eos_token_id"));
      }
    }
    if (cfg.contains("rope_scaling") && !cfg["rope_scaling"].is_null()) {
      const json& s = cfg["rope_scaling"];
      const std::string type = s.value("rope_type", s.value("type", std::string("")));
      if (type != "llama3") return bad(absl::StrCat("rope_scaling type '", type, "' is not supported (llama3 only)"));
      c.rope.llama3_scaling = true;
      c.rope.scaling_factor = s.value("factor", 8.0);
      c.rope.low_freq_factor = s.value("low_freq_factor", 1.0);
      c.rope.high_freq_factor = s.value("high_freq_factor", 4.0);
      c.rope.original_max_position = s.value("original_max_position_embeddings", 8192.0);
    }
  } catch (const json::exception& e) {
    return bad(absl::StrCat("bad field: ", e.what()));
  }
  if (!bad_field.empty()) return bad(absl::StrCat(bad_field, " is not an integer within int's range"));
  if (absl::Status s = c.Validate(); !s.ok()) return bad(std::string(s.message()));
  return c;
}

absl::StatusOr<ModelWeights> LoadHfCheckpoint(const std::string& directory) {
  const fs::path dir(directory);
  ASSIGN_OR_RETURN(std::string config_text, ReadFileToString((dir / "config.json").string()));
  ASSIGN_OR_RETURN(ModelConfig config, ParseHfConfig(config_text, (dir / "config.json").string()));
  config.name = directory;
  // generation_config.json's end-of-sequence ids end a reply too (Llama 3 Instruct lists
  // <|eot_id|> there); a malformed one is refused rather than ignored.
  if (const fs::path generation = dir / "generation_config.json"; fs::exists(generation)) {
    ASSIGN_OR_RETURN(std::string text, ReadFileToString(generation.string()));
    const json g = json::parse(text, nullptr, false);
    if (g.is_discarded() || !g.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(generation.string(), ": not a JSON object"));
    }
    if (g.contains("eos_token_id") && !g["eos_token_id"].is_null()) {
      const json ids = g["eos_token_id"].is_array() ? g["eos_token_id"] : json::array({g["eos_token_id"]});
      for (const json& id : ids) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= config.vocab_size) {
          return absl::InvalidArgumentError(
              absl::StrCat(generation.string(), ": eos_token_id ", id.dump(), " is not a token id of the vocabulary"));
        }
        if (!config.IsEndOfSequence(id.get<int>())) config.other_eos_ids.push_back(id.get<int>());
      }
    }
  }

  // Which files hold the weights: one model.safetensors, or shards named by the index.
  std::vector<std::string> shard_paths;
  const fs::path index_path = dir / "model.safetensors.index.json";
  if (fs::exists(index_path)) {
    ASSIGN_OR_RETURN(std::string index_text, ReadFileToString(index_path.string()));
    json index = json::parse(index_text, nullptr, false);
    if (index.is_discarded() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(index_path.string(), ": no weight_map object"));
    }
    for (auto& [name, file] : index["weight_map"].items()) {
      if (!file.is_string()) return absl::InvalidArgumentError(absl::StrCat(index_path.string(), ": bad entry ", name));
      const std::string shard = (dir / file.get<std::string>()).string();
      if (std::find(shard_paths.begin(), shard_paths.end(), shard) == shard_paths.end()) shard_paths.push_back(shard);
    }
  } else {
    shard_paths.push_back((dir / "model.safetensors").string());
  }
  std::vector<SafetensorsFile> shards;
  shards.reserve(shard_paths.size());
  for (const std::string& path : shard_paths) {
    ASSIGN_OR_RETURN(MappedFile mapped, MappedFile::Open(path));
    shards.push_back(SafetensorsFile{std::move(mapped), {}});
    RETURN_IF_ERROR(ParseSafetensors(shards.back()));
  }
  auto find = [&](const std::string& name) -> const TensorView* {
    for (const SafetensorsFile& shard : shards) {
      if (auto it = shard.tensors.find(name); it != shard.tensors.end()) return &it->second;
    }
    return nullptr;
  };

  // Every weight the config implies is stored at 2 bytes or more (BF16, F16; F32 takes 4),
  // so the files must hold at least twice as many bytes as there are weights. Checked
  // before anything is allocated: a config.json beside small weights must not make the
  // loader allocate (and zero) what the config claims, up to terabytes.
  uint64_t file_bytes = 0;
  for (const SafetensorsFile& shard : shards) file_bytes += shard.mapped.size();
  ModelWeights shape;  // no tensor allocated: only the config and the layer count
  shape.config = config;
  shape.layers.resize(config.n_layers);
  uint64_t weights = 0;
  ForEachTensor(shape, [&](const std::string&, const std::vector<float>&, size_t n) { weights += n; });
  if (weights > file_bytes / 2) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: the config implies %d weights (at least %d bytes), the safetensors files hold %d bytes (truncated?)",
        directory, weights, 2 * weights, file_bytes));
  }

  ModelWeights w = AllocateWeights(config);
  const int64_t dim = config.dim, hidden = config.hidden_dim, q = config.q_dim(), kv = config.kv_dim(),
                vocab = config.vocab_size;
  auto load = [&](const std::string& name, std::vector<int64_t> shape, std::vector<float>& dst) -> absl::Status {
    const TensorView* t = find(name);
    if (t == nullptr) {
      return absl::InvalidArgumentError(absl::StrFormat("%s: missing tensor %s", directory, name));
    }
    return CopyTensor(*t, name, std::move(shape), dst);
  };
  RETURN_IF_ERROR(load("model.embed_tokens.weight", {vocab, dim}, w.embedding));
  for (int l = 0; l < config.n_layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    LayerWeights& layer = w.layers[l];
    RETURN_IF_ERROR(load(p + "input_layernorm.weight", {dim}, layer.attn_norm));
    RETURN_IF_ERROR(load(p + "self_attn.q_proj.weight", {q, dim}, layer.wq));
    RETURN_IF_ERROR(load(p + "self_attn.k_proj.weight", {kv, dim}, layer.wk));
    RETURN_IF_ERROR(load(p + "self_attn.v_proj.weight", {kv, dim}, layer.wv));
    RETURN_IF_ERROR(load(p + "self_attn.o_proj.weight", {dim, q}, layer.wo));
    RETURN_IF_ERROR(load(p + "post_attention_layernorm.weight", {dim}, layer.ffn_norm));
    RETURN_IF_ERROR(load(p + "mlp.gate_proj.weight", {hidden, dim}, layer.w_gate));
    RETURN_IF_ERROR(load(p + "mlp.up_proj.weight", {hidden, dim}, layer.w_up));
    RETURN_IF_ERROR(load(p + "mlp.down_proj.weight", {dim, hidden}, layer.w_down));
  }
  RETURN_IF_ERROR(load("model.norm.weight", {dim}, w.final_norm));
  if (!config.shared_classifier) RETURN_IF_ERROR(load("lm_head.weight", {vocab, dim}, w.classifier));
  w.content_hash = HashWeights(w);
  return w;
}

}  // namespace lazykv
