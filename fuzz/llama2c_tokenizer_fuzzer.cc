// llama2c_tokenizer_fuzzer: the llama2.c tokenizer (worker/tokenizer/llama2c_tokenizer.cc
// through worker/tokenizer/tokenizer.h), with the vocabularies ../shared/models/tok512.bin
// and tok32000.bin (LAZYKV_MODELS_DIR overrides the folder; without them, a small
// vocabulary written here).
//
// The first input byte picks what the rest is:
// - text (at most 64 KiB), encoded by every vocabulary;
// - token ids (int32, any value), decoded;
// - a tokenizer.bin file, loaded (LoadLlama2cTokenizer), then used to encode and decode.
// Invariants (abort on violation):
// - every id Encode returns is inside the vocabulary;
// - for the real vocabularies, none is <s> or </s> (text cannot turn into control tokens)
//   and Decode(Encode(text)) == text (tokenizer.h: Decode is Encode's inverse; byte
//   fallback covers every byte);
// - Decode never fails on ids outside the vocabulary: it skips them, so the result is
//   that of the ids inside it; DecodeContinuation never crashes either;
// - a tokenizer.bin that loads has at least <unk>, <s>, </s> and the 256 byte tokens.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "fuzz/tokenizer_checks.h"
#include "worker/tokenizer/tokenizer.h"

namespace {

using namespace lazykv;

constexpr size_t kMaxTextBytes = 64 << 10;
constexpr int32_t kBos = 1, kEos = 2;

struct Vocabulary {
  std::string name;
  std::unique_ptr<Tokenizer> tokenizer;
  bool strict;  // a real vocabulary: round trip and no control ids checked
};
std::vector<Vocabulary> g_vocabularies;

// A tokenizer.bin: max_token_length, then (score, length, bytes) per piece.
std::string TokenizerFile(const std::vector<std::pair<std::string, float>>& pieces) {
  std::string out(4, '\0');
  const int32_t max_len = 16;
  std::memcpy(out.data(), &max_len, 4);
  for (const auto& [piece, score] : pieces) {
    const int32_t len = static_cast<int32_t>(piece.size());
    out.append(reinterpret_cast<const char*>(&score), 4);
    out.append(reinterpret_cast<const char*>(&len), 4);
    out += piece;
  }
  return out;
}

// <unk>, <s>, </s>, the byte tokens, and a few merges (with " " for the dummy prefix).
std::string SmallVocabulary() {
  std::vector<std::pair<std::string, float>> pieces = {{"<unk>", 0}, {"<s>", 0}, {"</s>", 0}};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    pieces.push_back({name, 0});
  }
  float score = -1;
  for (const char* piece : {" ", "a", "b", "c", "e", "h", "t", "th", "the", " the", " a", "ab", "abc", "<", "s>"}) {
    pieces.push_back({piece, score});
    score -= 1;
  }
  return TokenizerFile(pieces);
}

void CheckEncode(const Vocabulary& v, std::string_view text) {
  const std::vector<int32_t> ids = v.tokenizer->Encode(text);
  for (int32_t id : ids) {
    FUZZ_CHECK(id >= 0 && id < v.tokenizer->vocab_size());
    if (v.strict) FUZZ_CHECK(id != kBos && id != kEos);
  }
  FUZZ_CHECK(text.empty() == ids.empty());
  if (v.strict) {
    const std::string decoded = v.tokenizer->Decode(ids);
    if (decoded != text) {
      std::fprintf(stderr, "%s: %zu bytes of text decode to %zu bytes\n", v.name.c_str(), text.size(),
                   decoded.size());
    }
    FUZZ_CHECK(decoded == text);
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  for (const char* file : {"tok512.bin", "tok32000.bin"}) {
    const std::string path = fuzz::ModelPath(file);
    if (path.empty()) continue;
    auto tokenizer = LoadLlama2cTokenizer(path);
    if (!tokenizer.ok()) {
      std::fprintf(stderr, "llama2c_tokenizer_fuzzer: %s\n", tokenizer.status().ToString().c_str());
      std::abort();
    }
    g_vocabularies.push_back({file, *std::move(tokenizer), true});
  }
  const std::string path = fuzz::ScratchDir() + "/small_tokenizer.bin";
  fuzz::WriteFile(path, SmallVocabulary());
  auto small = LoadLlama2cTokenizer(path);
  if (!small.ok()) {
    std::fprintf(stderr, "llama2c_tokenizer_fuzzer: %s\n", small.status().ToString().c_str());
    std::abort();
  }
  // Its pieces "<" and "s>" merge into "<s>", the BOS piece: not held to the strict checks.
  g_vocabularies.push_back({"small", *std::move(small), false});
  if (g_vocabularies.size() == 1) {
    std::fprintf(stderr, "llama2c_tokenizer_fuzzer: no tok512.bin or tok32000.bin in the models folder; "
                         "fuzzing a small vocabulary only\n");
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0 || size > kMaxTextBytes + 1) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 4) {
    case 0:
    case 1:  // text
      for (const Vocabulary& v : g_vocabularies) CheckEncode(v, rest);
      break;
    case 2: {  // ids
      std::vector<int32_t> ids(rest.size() / 4);
      if (!ids.empty()) std::memcpy(ids.data(), rest.data(), ids.size() * 4);
      // Most ids small, so that real pieces get decoded, unless the byte says otherwise.
      if (data[0] & 4) {
        for (int32_t& id : ids) id %= 40000;
      }
      const size_t split = ids.empty() ? 0 : static_cast<uint8_t>(rest.back()) % (ids.size() + 1);
      for (const Vocabulary& v : g_vocabularies) fuzz::CheckDecode(*v.tokenizer, ids, split);
      break;
    }
    default: {  // a tokenizer.bin
      static const std::string path = fuzz::ScratchDir() + "/tokenizer.bin";
      fuzz::WriteFile(path, rest);
      absl::StatusOr<std::unique_ptr<Tokenizer>> loaded = LoadLlama2cTokenizer(path);
      if (!loaded.ok()) break;
      const Tokenizer& t = **loaded;
      FUZZ_CHECK(t.vocab_size() >= 3 + 256);
      Vocabulary v{"fuzzed", *std::move(loaded), false};
      CheckEncode(v, "The quick brown fox jumps over the lazy dog. \xE2\x82\xAC \xFF\n\t 42");
      CheckEncode(v, rest.substr(0, 512));
      std::vector<int32_t> ids;
      for (int32_t id = -2; id < 300; ++id) ids.push_back(id);
      fuzz::CheckDecode(*v.tokenizer, ids, 100);
      break;
    }
  }
  return 0;
}
