// Model loaders: llama2.c and Hugging Face checkpoints load the same model, and bad
// files get errors that name the file and the problem.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "gtest/gtest.h"
#include "tests/test_util.h"
#include "worker/model/llama2c_loader.h"
#include "worker/model/model_loader.h"
#include "worker/model/safetensors_loader.h"
#include "worker/model/synthetic_model.h"

namespace lazykv::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class TempDir {
 public:
  TempDir() : path_(fs::temp_directory_path() / ("lazykv_test_" + std::to_string(FreshSeed()))) {
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  std::string str() const { return path_.string(); }

 private:
  fs::path path_;
};

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), bytes.size());
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void ExpectInvalid(const absl::Status& status, const std::string& path, const std::string& needle) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find(path), std::string::npos) << status;
  EXPECT_NE(status.message().find(needle), std::string::npos) << status;
}

TEST(Llama2cLoaderTest, LoadsTheStoriesCheckpoint) {
  if (!HaveModel("stories260K.bin")) GTEST_SKIP() << "no ../shared/models";
  auto w = LoadLlama2cCheckpoint(ModelPath("stories260K.bin"));
  ASSERT_TRUE(w.ok()) << w.status();
  const ModelConfig& c = w->config;
  EXPECT_EQ(std::tie(c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, c.vocab_size, c.max_seq_len),
            std::make_tuple(64, 172, 5, 8, 4, 512, 512));
  EXPECT_TRUE(c.shared_classifier);
  EXPECT_EQ(c.rope.style, RopeStyle::kInterleaved);
  // Stable identity: loading twice gives the same fingerprint; another model another.
  auto again = LoadLlama2cCheckpoint(ModelPath("stories260K.bin"));
  EXPECT_EQ(w->content_hash, again->content_hash);
  if (HaveModel("tinystories-gqa-d64-h192-l5.bin")) {
    auto other = LoadLlama2cCheckpoint(ModelPath("tinystories-gqa-d64-h192-l5.bin"));
    ASSERT_TRUE(other.ok()) << other.status();
    EXPECT_NE(w->content_hash, other->content_hash);
  }
}

TEST(Llama2cLoaderTest, RejectsCorruptFiles) {
  if (!HaveModel("stories260K.bin")) GTEST_SKIP() << "no ../shared/models";
  const std::string good = ReadBytes(ModelPath("stories260K.bin"));
  TempDir dir;
  const std::string path = dir.file("model.bin");

  WriteBytes(path, good.substr(0, good.size() - 100));
  ExpectInvalid(LoadLlama2cCheckpoint(path).status(), path, "truncated");
  WriteBytes(path, good + "extra");
  ExpectInvalid(LoadLlama2cCheckpoint(path).status(), path, "trailing data");
  WriteBytes(path, good.substr(0, 10));
  ExpectInvalid(LoadLlama2cCheckpoint(path).status(), path, "truncated");
  std::string magic = good;
  magic.replace(0, 8, std::string("\x32\x34\x6b\x61\x01\x00\x00\x00", 8));
  WriteBytes(path, magic);
  ExpectInvalid(LoadLlama2cCheckpoint(path).status(), path, "magic");
  std::string bad_heads = good;
  const int32_t seven = 7;
  bad_heads.replace(12, 4, reinterpret_cast<const char*>(&seven), 4);  // n_heads 7 does not divide dim 64
  WriteBytes(path, bad_heads);
  ExpectInvalid(LoadLlama2cCheckpoint(path).status(), path, "n_heads");
  EXPECT_EQ(LoadModel(dir.file("missing.bin")).status().code(), absl::StatusCode::kNotFound);
  // Found by fuzzing: a 28-byte header of huge dimensions made the loader allocate (and
  // zero) its weights before seeing the file is far too short. It is refused at once now.
  const int32_t huge_header[7] = {65536, 65536 * 4, 1024,   512,
                                  512,   1 << 24,   1 << 16};  // dim .. seq_len: ~10^13 weights
  WriteBytes(path, std::string(reinterpret_cast<const char*>(huge_header), sizeof(huge_header)));
  ExpectInvalid(LoadLlama2cCheckpoint(path).status(), path, "truncated");
}

// --- Hugging Face checkpoints written from a llama2.c model -----------------------

enum class Dtype { kF32, kBF16, kF16 };

uint16_t ToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return static_cast<uint16_t>((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);  // round to nearest even
}

uint16_t ToF16(float f) {  // normal range only, round to nearest (test weights are small)
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint32_t sign = (bits >> 16) & 0x8000;
  const int exponent = static_cast<int>((bits >> 23) & 0xff) - 127 + 15;
  if (exponent <= 0) return static_cast<uint16_t>(sign);
  const uint32_t mantissa = bits & 0x7fffff;
  uint32_t half = sign | (exponent << 10) | (mantissa >> 13);
  if ((mantissa & 0x1fff) > 0x1000 || ((mantissa & 0x1fff) == 0x1000 && (half & 1))) ++half;
  return static_cast<uint16_t>(half);
}

// The Hugging Face conversion's permutation of q/k rows: interleaved pairs (2i, 2i+1)
// become rotate-half pairs (i, i + d/2).
std::vector<float> PermuteForRotateHalf(const std::vector<float>& w, int heads, int head_dim, int cols) {
  std::vector<float> out(w.size());
  for (int h = 0; h < heads; ++h) {
    for (int i = 0; i < head_dim / 2; ++i) {
      for (int j = 0; j < 2; ++j) {
        const size_t from = static_cast<size_t>(h * head_dim + 2 * i + j) * cols;
        const size_t to = static_cast<size_t>(h * head_dim + j * head_dim / 2 + i) * cols;
        std::copy(w.begin() + from, w.begin() + from + cols, out.begin() + to);
      }
    }
  }
  return out;
}

struct NamedTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> values;
};

std::vector<NamedTensor> HfTensors(const ModelWeights& w) {
  const ModelConfig& c = w.config;
  const int64_t dim = c.dim, hidden = c.hidden_dim, q = c.q_dim(), kv = c.kv_dim();
  std::vector<NamedTensor> t = {{"model.embed_tokens.weight", {c.vocab_size, dim}, w.embedding},
                                {"model.norm.weight", {dim}, w.final_norm}};
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights& lw = w.layers[l];
    const std::string p = "model.layers." + std::to_string(l) + ".";
    t.push_back({p + "input_layernorm.weight", {dim}, lw.attn_norm});
    t.push_back({p + "self_attn.q_proj.weight", {q, dim}, PermuteForRotateHalf(lw.wq, c.n_heads, c.head_dim, dim)});
    t.push_back({p + "self_attn.k_proj.weight", {kv, dim}, PermuteForRotateHalf(lw.wk, c.n_kv_heads, c.head_dim, dim)});
    t.push_back({p + "self_attn.v_proj.weight", {kv, dim}, lw.wv});
    t.push_back({p + "self_attn.o_proj.weight", {dim, q}, lw.wo});
    t.push_back({p + "post_attention_layernorm.weight", {dim}, lw.ffn_norm});
    t.push_back({p + "mlp.gate_proj.weight", {hidden, dim}, lw.w_gate});
    t.push_back({p + "mlp.up_proj.weight", {hidden, dim}, lw.w_up});
    t.push_back({p + "mlp.down_proj.weight", {dim, hidden}, lw.w_down});
  }
  return t;
}

void WriteSafetensors(const std::string& path, const std::vector<NamedTensor>& tensors, Dtype dtype) {
  json header = json::object();
  std::string data;
  for (const NamedTensor& t : tensors) {
    const size_t begin = data.size();
    for (float v : t.values) {
      if (dtype == Dtype::kF32) {
        data.append(reinterpret_cast<const char*>(&v), 4);
      } else {
        const uint16_t h = dtype == Dtype::kBF16 ? ToBf16(v) : ToF16(v);
        data.append(reinterpret_cast<const char*>(&h), 2);
      }
    }
    header[t.name] = {{"dtype", dtype == Dtype::kF32    ? "F32"
                                : dtype == Dtype::kBF16 ? "BF16"
                                                        : "F16"},
                      {"shape", t.shape},
                      {"data_offsets", {begin, data.size()}}};
  }
  const std::string text = header.dump();
  const uint64_t len = text.size();
  WriteBytes(path, std::string(reinterpret_cast<const char*>(&len), 8) + text + data);
}

json HfConfig(const ModelConfig& c) {
  return {{"model_type", "llama"},
          {"hidden_size", c.dim},
          {"intermediate_size", c.hidden_dim},
          {"num_hidden_layers", c.n_layers},
          {"num_attention_heads", c.n_heads},
          {"num_key_value_heads", c.n_kv_heads},
          {"vocab_size", c.vocab_size},
          {"max_position_embeddings", c.max_seq_len},
          {"rms_norm_eps", 1e-5},
          {"rope_theta", 10000.0},
          {"tie_word_embeddings", true},
          {"bos_token_id", 1},
          {"eos_token_id", 2}};
}

TEST(HfLoaderTest, SafetensorsCheckpointComputesTheSameModelAsLlama2c) {
  if (!HaveModel("stories260K.bin")) GTEST_SKIP() << "no ../shared/models";
  auto llama2c = LoadLlama2cCheckpoint(ModelPath("stories260K.bin"));
  ASSERT_TRUE(llama2c.ok());
  std::mt19937_64 rng(FreshSeed());
  const auto tokens = RandomTokens(rng, 40, 512);
  const auto reference = NaiveForward(*llama2c, tokens);
  for (Dtype dtype : {Dtype::kF32, Dtype::kBF16, Dtype::kF16}) {
    TempDir dir;
    WriteBytes(dir.file("config.json"), HfConfig(llama2c->config).dump());
    WriteSafetensors(dir.file("model.safetensors"), HfTensors(*llama2c), dtype);
    auto hf = LoadModel(dir.str());
    ASSERT_TRUE(hf.ok()) << hf.status();
    EXPECT_EQ(hf->config.rope.style, RopeStyle::kRotateHalf);
    const auto logits = NaiveForward(*hf, tokens);
    // fp32 is exact up to summation order; 16-bit weights round, so compare loosely.
    const double tolerance = dtype == Dtype::kF32 ? 1e-5 : 0.05;
    for (size_t t = 0; t < tokens.size(); t += 13) {
      EXPECT_LT(RelativeError(logits[t], reference[t]), tolerance) << "position " << t;
    }
    if (dtype != Dtype::kF32) {  // conversion is exact: every loaded value equals the rounded one
      const float v = llama2c->layers[2].w_up[77];
      const float expected = dtype == Dtype::kBF16 ? Bfloat16ToFloat(ToBf16(v)) : HalfToFloat(ToF16(v));
      EXPECT_EQ(hf->layers[2].w_up[77], expected);
    }
  }
}

TEST(HfLoaderTest, ShardedCheckpointLoads) {
  const ModelWeights w = MakeSyntheticWeights(*SyntheticConfig("tiny"), FreshSeed());
  TempDir dir;
  auto tensors = HfTensors(w);
  const size_t half = tensors.size() / 2;
  json index = {{"weight_map", json::object()}};
  for (size_t i = 0; i < tensors.size(); ++i)
    index["weight_map"][tensors[i].name] = i < half ? "a.safetensors" : "b.safetensors";
  WriteSafetensors(dir.file("a.safetensors"), {tensors.begin(), tensors.begin() + half}, Dtype::kF32);
  WriteSafetensors(dir.file("b.safetensors"), {tensors.begin() + half, tensors.end()}, Dtype::kF32);
  WriteBytes(dir.file("model.safetensors.index.json"), index.dump());
  WriteBytes(dir.file("config.json"), HfConfig(w.config).dump());
  auto loaded = LoadModel(dir.str());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->layers[3].w_down, w.layers[3].w_down);
}

// generation_config.json's end-of-sequence ids join config.json's (as transformers'
// generate uses them); one outside the vocabulary is refused, naming the file.
TEST(HfLoaderTest, GenerationConfigAddsEndOfSequenceIds) {
  const ModelWeights w = MakeSyntheticWeights(*SyntheticConfig("tiny"), FreshSeed());
  TempDir dir;
  WriteSafetensors(dir.file("model.safetensors"), HfTensors(w), Dtype::kF32);
  WriteBytes(dir.file("config.json"), HfConfig(w.config).dump());
  WriteBytes(dir.file("generation_config.json"), json{{"eos_token_id", {w.config.eos_id, 7, 9}}}.dump());
  auto loaded = LoadModel(dir.str());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->config.other_eos_ids, (std::vector<int>{7, 9}));
  WriteBytes(dir.file("generation_config.json"), json{{"eos_token_id", 5}}.dump());
  loaded = LoadModel(dir.str());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->config.other_eos_ids, (std::vector<int>{5}));
  WriteBytes(dir.file("generation_config.json"), json{{"eos_token_id", w.config.vocab_size}}.dump());
  ExpectInvalid(LoadModel(dir.str()).status(), "generation_config.json", "eos_token_id");
}

TEST(HfLoaderTest, RejectsBadCheckpoints) {
  const ModelWeights w = MakeSyntheticWeights(*SyntheticConfig("tiny"), FreshSeed());
  TempDir dir;
  const std::string model = dir.file("model.safetensors");
  WriteBytes(dir.file("config.json"), HfConfig(w.config).dump());
  auto tensors = HfTensors(w);

  auto missing = tensors;
  missing.erase(missing.begin() + 5);
  WriteSafetensors(model, missing, Dtype::kF32);
  ExpectInvalid(LoadModel(dir.str()).status(), dir.str(), "missing tensor " + tensors[5].name);

  auto misshapen = tensors;
  misshapen[3].shape = {1, static_cast<int64_t>(misshapen[3].values.size())};
  WriteSafetensors(model, misshapen, Dtype::kF32);
  ExpectInvalid(LoadModel(dir.str()).status(), model, "shape");

  WriteSafetensors(model, tensors, Dtype::kF32);
  const std::string good = ReadBytes(model);
  WriteBytes(model, good.substr(0, good.size() - 64));
  ExpectInvalid(LoadModel(dir.str()).status(), model, "truncated");
  WriteBytes(model, std::string("\xff\xff\xff\xff\x00\x00\x00\x00", 8) + good.substr(8));
  ExpectInvalid(LoadModel(dir.str()).status(), model, "header length");
  // A shape or data offset that is a float, or out of range: refused by name, never cast.
  for (const auto& [field, value] : {std::pair<std::string, json>{"shape", json::array({1e300, 4})},
                                     {"shape", json::array({2.0, 4})},
                                     {"data_offsets", json::array({0, 1e300})},
                                     {"data_offsets", json::array({-1, 8})}}) {
    SCOPED_TRACE(field + " " + value.dump());
    uint64_t len = 0;
    std::memcpy(&len, good.data(), 8);
    json header = json::parse(good.substr(8, len));
    header[tensors[0].name][field] = value;
    const std::string text = header.dump();
    const uint64_t new_len = text.size();
    WriteBytes(model, std::string(reinterpret_cast<const char*>(&new_len), 8) + text + good.substr(8 + len));
    ExpectInvalid(LoadModel(dir.str()).status(), model, field + " is not a list of integers");
  }
  WriteBytes(model, good);

  json config = HfConfig(w.config);
  config.erase("hidden_size");
  WriteBytes(dir.file("config.json"), config.dump());
  ExpectInvalid(LoadModel(dir.str()).status(), "config.json", "hidden_size");
  config = HfConfig(w.config);
  config["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  WriteBytes(dir.file("config.json"), config.dump());
  ExpectInvalid(LoadModel(dir.str()).status(), "config.json", "yarn");
  WriteBytes(dir.file("config.json"), "{not json");
  ExpectInvalid(LoadModel(dir.str()).status(), "config.json", "JSON");
}

TEST(HfLoaderTest, ParsesLlama3Config) {
  const std::string text = R"({"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "tie_word_embeddings": false, "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009]})";
  auto c = ParseHfConfig(text, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->eos_id, 128001);
  EXPECT_EQ(c->other_eos_ids, (std::vector<int>{128008, 128009}));
  EXPECT_TRUE(c->IsEndOfSequence(128009));
  EXPECT_FALSE(c->IsEndOfSequence(128000));
  EXPECT_TRUE(c->rope.llama3_scaling);
  EXPECT_FALSE(c->shared_classifier);
  // Llama-3 scaling, from its definition: high frequencies unchanged, low ones / 8.
  const auto inv = RopeInverseFrequencies(c->rope, 128);
  EXPECT_DOUBLE_EQ(inv[0], 1.0);
  EXPECT_NEAR(inv[63], std::pow(500000.0, -126.0 / 128) / 8.0, 1e-18);
  const auto synthetic = SyntheticConfig("llama3-8b");
  ASSERT_TRUE(synthetic.ok());
  Hasher128 a, b;
  c->HashInto(a);
  synthetic->HashInto(b);
  EXPECT_EQ(a.Finish(), b.Finish()) << "synthetic:llama3-8b must have the real Llama-3-8B shape";
}

// Numbers out of their type's range are refused by name (a cast of them would be undefined:
// the fuzzer found vocab_size 5.99e49), and whole floats are taken as the integers they are.
TEST(HfLoaderTest, RefusesNumbersOutsideTheirTypeAndTakesWholeFloats) {
  const json base = json::parse(R"({"model_type": "llama", "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "vocab_size": 512})");
  auto with = [&](const char* field, json value) {
    json c = base;
    c[field] = std::move(value);
    return ParseHfConfig(c.dump(), "config.json");
  };
  ASSERT_TRUE(ParseHfConfig(base.dump(), "config.json").ok());
  for (const char* field :
       {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
        "vocab_size", "head_dim", "max_position_embeddings", "bos_token_id", "eos_token_id"}) {
    SCOPED_TRACE(field);
    for (const json& bad : {json(5.99e49), json(-3e12), json(2.5), json(uint64_t{1} << 40)}) {
      auto parsed = with(field, bad);
      EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << bad.dump();
      EXPECT_NE(parsed.status().message().find(field), std::string::npos) << parsed.status();
    }
  }
  auto eos_list = with("eos_token_id", json::array({2, 1e40}));
  EXPECT_NE(eos_list.status().message().find("eos_token_id"), std::string::npos) << eos_list.status();
  for (const json& bad : {json(1e300), json(-1e39)}) {
    auto parsed = with("rms_norm_eps", bad);
    EXPECT_NE(parsed.status().message().find("rms_norm_eps"), std::string::npos) << parsed.status();
  }
  auto whole = with("hidden_size", 64.0);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(whole->dim, 64);
  EXPECT_EQ(with("rms_norm_eps", 1e-5)->norm_eps, 1e-5f);
}

TEST(SyntheticModelTest, DeterministicPerSeedAndNamed) {
  auto a = LoadModel("synthetic:tiny:7");
  auto b = LoadModel("synthetic:tiny:7");
  auto c = LoadModel("synthetic:tiny:8");
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->layers[1].wq, b->layers[1].wq);
  EXPECT_NE(a->layers[1].wq, c->layers[1].wq);
  EXPECT_EQ(a->content_hash, b->content_hash);
  EXPECT_NE(a->content_hash, c->content_hash);
  EXPECT_EQ(LoadModel("synthetic:nope").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadModel("synthetic:tiny:x").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace lazykv::testing
