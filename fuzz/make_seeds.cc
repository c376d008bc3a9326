// make_seeds: writes the seed corpora of the fuzz targets (fuzz/corpus/<target>/), small
// valid inputs made with the project's own encoders, so that fuzzing starts from inputs
// that reach deep. Run by hand after a format change:
//   build-fuzz/bin/lazykv_fuzz_make_seeds fuzz/corpus
// (scripts/fuzz.sh never runs it and never writes to fuzz/corpus.)
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/chunk_codec.h"
#include "common/chunk_mac.h"
#include "common/chunk_wire.h"
#include "fuzz/fuzz_util.h"

namespace {

using namespace lazykv;
using nlohmann::json;

std::string g_root;

void Seed(const std::string& target, const std::string& name, std::string_view bytes) {
  const std::string dir = g_root + "/" + target;
  std::filesystem::create_directories(dir);
  fuzz::WriteFile(dir + "/" + name, bytes);
}

template <typename T>
void Append(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

// A payload of `layout`'s size: small finite values (or one infinity at `inf_at`).
std::string Payload(const ChunkLayout& layout, long inf_at = -1) {
  std::string p;
  const size_t n = layout.payload_bytes() / KvDtypeBytes(layout.dtype);
  for (size_t i = 0; i < n; ++i) {
    const float f = static_cast<long>(i) == inf_at ? INFINITY : 0.25f * static_cast<float>(i % 7) - 0.5f;
    if (layout.dtype == KvDtype::kFp32) {
      Append(p, f);
    } else if (layout.dtype == KvDtype::kBf16) {
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      Append(p, static_cast<uint16_t>(bits >> 16));
    } else {
      Append(p, static_cast<uint16_t>(static_cast<long>(i) == inf_at ? 0x7C00 : 0x3C00 + (i % 7)));  // 1.0 and up
    }
  }
  return p;
}

std::string Chunk(const ChunkLayout& layout, bool sign, long inf_at = -1) {
  const std::string payload = Payload(layout, inf_at);
  ChunkHeader header = MakeChunkHeader({0x1234, 0x5678}, {0xabcd, 0xef01}, layout, payload);
  if (sign) {
    const std::string_view view(payload);
    header.mac = ChunkMac(std::string(fuzz::kTestMacKey)).Sign(header, {&view, 1});
  }
  return EncodeChunk(header, payload);
}

void ChunkSeeds() {
  const std::string t = "chunk_codec_fuzzer";
  Seed(t, "fp32_signed", Chunk({2, 1, 4, 2, 1, KvDtype::kFp32}, true));
  Seed(t, "bf16_unsigned", Chunk({1, 2, 2, 3, 1, KvDtype::kBf16}, false));
  Seed(t, "fp16_infinity", Chunk({1, 1, 4, 2, 0, KvDtype::kFp16}, true, 5));
  Seed(t, "empty_layout", Chunk({0, 1, 4, 2, 1, KvDtype::kFp32}, false));
  Seed(t, "header_only", Chunk({1, 1, 2, 1, 1, KvDtype::kFp32}, false).substr(0, kChunkHeaderBytes));
  // Regression: a layout of 2^31 x 2^31 x 2^31 x 2^31 wraps its 64-bit size to 0, which
  // DecodeChunk accepted with an empty payload (fixed in common/chunk_codec.cc).
  const ChunkLayout wrapped{1u << 31, 1u << 31, 1u << 31, 1u << 31, 0, KvDtype::kFp32};
  Seed(t, "regress_wrapped_layout", EncodeChunkHeader(MakeChunkHeader({1, 2}, {3, 4}, wrapped, "")));
}

std::string GetResponseWire(const std::string& header, v1::Tier tier, const std::vector<std::string>& data) {
  OutgoingGetResponse message;
  message.header = header;
  message.tier = tier;
  for (const std::string& d : data) message.data.push_back(d);
  grpc::ByteBuffer buffer;
  bool own;
  (void)grpc::SerializationTraits<OutgoingGetResponse, void>::Serialize(message, &buffer, &own);
  std::vector<grpc::Slice> slices;
  (void)buffer.Dump(&slices);
  std::string wire;
  for (const grpc::Slice& s : slices) wire.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return wire;
}

void WireSeeds() {
  const std::string t = "chunk_wire_fuzzer";
  const std::string chunk = Chunk({1, 1, 4, 2, 1, KvDtype::kFp32}, false);
  const std::string header = chunk.substr(0, kChunkHeaderBytes), payload = chunk.substr(kChunkHeaderBytes);
  Seed(t, "first_message", GetResponseWire(header, v1::TIER_HOST, {payload.substr(0, 20), payload.substr(20)}));
  Seed(t, "later_message", GetResponseWire("", v1::TIER_UNSPECIFIED, {payload}));
  Seed(t, "header_and_tier", GetResponseWire(header, v1::TIER_DISK, {}));
  Seed(t, "other_fields", std::string("\x09\x01\x02\x03\x04\x05\x06\x07\x08\x15\x01\x02\x03\x04\x20\x05", 16));
  // Regression: a valid header claiming a 32 TiB payload made Deserialize reserve all of it
  // (an exception or the memory; fixed in common/chunk_wire.cc).
  const ChunkLayout huge{1024, 64, 128, 1u << 20, 1, KvDtype::kFp16};
  ChunkHeader h = MakeChunkHeader({1, 2}, {3, 4}, huge, "");
  h.payload_bytes = huge.payload_bytes();
  Seed(t, "regress_huge_header", GetResponseWire(EncodeChunkHeader(h), v1::TIER_HOST, {"x"}));
}

// A llama2.c version-0 checkpoint: dim 8, hidden 16, 1 layer, 2 heads, 2 KV heads,
// vocab 4 (negative: an unshared classifier), seq_len 4.
std::string Llama2c(bool shared) {
  const int32_t dim = 8, hidden = 16, layers = 1, heads = 2, kv_heads = 2, vocab = 4, seq = 4;
  std::string out;
  for (int32_t v : {dim, hidden, layers, heads, kv_heads, shared ? vocab : -vocab, seq}) Append(out, v);
  const int head = dim / heads, kv_dim = kv_heads * head;
  size_t floats = vocab * dim + layers * (2 * dim + 2 * dim * dim + 2 * dim * kv_dim + 3 * dim * hidden) + dim +
                  seq * head + (shared ? 0 : vocab * dim);
  for (size_t i = 0; i < floats; ++i) Append(out, 0.01f * static_cast<float>(i % 13) - 0.06f);
  return out;
}

void Llama2cSeeds() {
  const std::string t = "llama2c_loader_fuzzer";
  Seed(t, "tiny_shared.bin", Llama2c(true));
  Seed(t, "tiny_unshared.bin", Llama2c(false));
  Seed(t, "truncated.bin", Llama2c(true).substr(0, 40));
  // Regression: a valid header alone (dim 65536, hidden 262144, 1024 layers, vocab 2^24)
  // made the loader allocate its terabytes before checking the file size (fixed in
  // worker/model/llama2c_loader.cc).
  std::string huge;
  for (int32_t v : {65536, 262144, 1024, 1024, 1024, 1 << 24, 1 << 24}) Append(huge, v);
  Seed(t, "regress_huge_header.bin", huge);
}

// model.safetensors for safetensors_loader_fuzzer's tiny untied config.
std::string Safetensors(const std::string& dtype) {
  const std::vector<std::pair<std::string, std::vector<int64_t>>> tensors = {
      {"model.embed_tokens.weight", {5, 4}},
      {"model.layers.0.input_layernorm.weight", {4}},
      {"model.layers.0.self_attn.q_proj.weight", {4, 4}},
      {"model.layers.0.self_attn.k_proj.weight", {2, 4}},
      {"model.layers.0.self_attn.v_proj.weight", {2, 4}},
      {"model.layers.0.self_attn.o_proj.weight", {4, 4}},
      {"model.layers.0.post_attention_layernorm.weight", {4}},
      {"model.layers.0.mlp.gate_proj.weight", {6, 4}},
      {"model.layers.0.mlp.up_proj.weight", {6, 4}},
      {"model.layers.0.mlp.down_proj.weight", {4, 6}},
      {"model.norm.weight", {4}},
      {"lm_head.weight", {5, 4}}};
  json header = {{"__metadata__", {{"format", "pt"}}}};
  std::string data;
  for (const auto& [name, shape] : tensors) {
    int64_t count = 1;
    for (int64_t d : shape) count *= d;
    const size_t begin = data.size();
    for (int64_t i = 0; i < count; ++i) {
      const float f = 0.125f * static_cast<float>(i % 9) - 0.5f;
      if (dtype == "F32") {
        Append(data, f);
      } else {
        uint32_t bits;
        std::memcpy(&bits, &f, 4);
        Append(data, static_cast<uint16_t>(bits >> 16));  // exact in bf16
      }
    }
    header[name] = {{"dtype", dtype}, {"shape", shape}, {"data_offsets", {begin, data.size()}}};
  }
  const std::string text = header.dump();
  std::string out;
  Append(out, static_cast<uint64_t>(text.size()));
  return out + text + data;
}

void SafetensorsSeeds() {
  const std::string t = "safetensors_loader_fuzzer";
  Seed(t, "tiny_f32.safetensors", Safetensors("F32"));
  Seed(t, "tiny_bf16.safetensors", Safetensors("BF16"));
  Seed(t, "config.json",
       json{{"model_type", "llama"}, {"hidden_size", 4}, {"intermediate_size", 6}, {"num_hidden_layers", 1},
            {"num_attention_heads", 2}, {"num_key_value_heads", 1}, {"vocab_size", 5}, {"bos_token_id", 1},
            {"eos_token_id", {2, 3}}, {"tie_word_embeddings", false}}
           .dump(2));
  Seed(t, "config_llama3.json",
       json{{"hidden_size", 8}, {"intermediate_size", 16}, {"num_hidden_layers", 2}, {"num_attention_heads", 2},
            {"vocab_size", 16}, {"head_dim", 4}, {"rope_theta", 500000.0},
            {"rope_scaling",
             {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
              {"original_max_position_embeddings", 8192}}}}
           .dump());
  // Regression: this config beside a small model.safetensors made the loader allocate
  // 2^40 weights before finding them missing (fixed in worker/model/safetensors_loader.cc).
  Seed(t, "regress_huge_config.json",
       json{{"hidden_size", 65536}, {"intermediate_size", 8}, {"num_hidden_layers", 1},
            {"num_attention_heads", 64}, {"vocab_size", 1 << 24}}
           .dump());
}

void RequestSeeds() {
  const std::string t = "request_json_fuzzer";
  Seed(t, "text", R"({"docs": ["Lily had a red ball.", "Tom liked to run fast."], "prompt": "One day"})");
  Seed(t, "ids", R"({"docs": [[1, 2, 3], []], "prompt": [4, 5], "max_tokens": 8, "mode": "lazy"})");
  Seed(t, "sampling", R"({"prompt": "Hi", "temperature": 0.7, "top_p": 0.9, "seed": 42, "mode": "block"})");
  Seed(t, "empty", "{}");
  Seed(t, "bad_field", R"({"docs": "not a list", "colour": 1})");
  // Regressions: numbers out of the field's range were converted with undefined behaviour
  // (floats) or wrapped (integers) (fixed in worker/cli/request_json.cc).
  Seed(t, "regress_float_seed", R"({"seed": 4.7e21})");
  Seed(t, "regress_float_max_tokens", R"({"max_tokens": -8.8e35})");
  Seed(t, "regress_wide_token_id", R"({"prompt": [4294967297]})");
}

void TokenizerSeeds() {
  const std::string l = "llama2c_tokenizer_fuzzer", s = "sentencepiece_tokenizer_fuzzer";
  const std::string story = "Once upon a time, there was a little girl named Lily. She liked to play outside.";
  const std::string unicode = "caf\xC3\xA9 \xE2\x82\xAC 100 \xF0\x9F\x99\x82 \xE6\x97\xA5\xE6\x9C\xAC \t\n  two  spaces";
  static const char kInvalid[] = "stray \x80 continuation, truncated \xE2\x82, lone \xFF byte, NUL \0 inside";
  const std::string invalid(kInvalid, sizeof(kInvalid) - 1);
  for (const std::string& target : {l, s}) {
    Seed(target, "story", std::string(1, '\0') + story);
    Seed(target, "unicode", std::string(1, '\0') + unicode);
    Seed(target, "invalid_utf8", std::string(1, '\0') + invalid);
    std::string ids(1, target == l ? '\x02' : '\x01');
    for (int32_t id : {1, 400, 17, -1, 2, 31999, 32000, 259, 3, 0x7fffffff}) Append(ids, id);
    Seed(target, "ids", ids);
  }
  // A tokenizer.bin (the llama2.c fuzzer's first byte 3 loads the rest).
  std::string vocab(1, '\x03');
  Append(vocab, int32_t{8});
  auto piece = [&](const std::string& text, float score) {
    Append(vocab, score);
    Append(vocab, static_cast<int32_t>(text.size()));
    vocab += text;
  };
  piece("<unk>", 0);
  piece("<s>", 0);
  piece("</s>", 0);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    piece(name, 0);
  }
  float score = -1;
  for (const char* p : {" ", "a", "b", "ab", " ab", "o", "n", "on", "ce"}) piece(p, score--);
  Seed(l, "tokenizer_bin", vocab);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR (fuzz/corpus)\n", argv[0]);
    return 2;
  }
  g_root = argv[1];
  ChunkSeeds();
  WireSeeds();
  Llama2cSeeds();
  SafetensorsSeeds();
  RequestSeeds();
  TokenizerSeeds();
  return 0;
}
