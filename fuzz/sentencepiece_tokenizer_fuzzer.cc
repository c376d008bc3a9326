// sentencepiece_tokenizer_fuzzer: the SentencePiece tokenizer (worker/tokenizer/
// sentencepiece_tokenizer.cc and the dlopen'ed module sentencepiece_module.cc around
// libsentencepiece), with ../shared/models/tok512.model and tok32000.model
// (LAZYKV_MODELS_DIR overrides the folder). Without either file it fuzzes nothing and
// says so.
//
// The first input byte picks what the rest is:
// - text (at most 64 KiB), encoded by every model;
// - token ids (int32, any value), decoded.
// Model files themselves are not fuzzed: parsing them is libsentencepiece's code (not
// built with the sanitizers), and they come from the operator, not from requests.
// Invariants (abort on violation):
// - every id Encode returns is inside the vocabulary and none is <s> or </s>;
// - Decode never fails on ids outside the vocabulary: it skips them, so the result is
//   that of the ids inside it; DecodeContinuation never crashes either.
#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "fuzz/tokenizer_checks.h"
#include "worker/tokenizer/tokenizer.h"

// The sanitizer runtime ends the process when anything dlopens with RTLD_DEEPBIND
// (google/sanitizers#611), and sentencepiece_model.cc loads its module that way, to keep
// libsentencepiece's protobuf copy apart from gRPC's libprotobuf. This process loads no
// libprotobuf, so here the flag is dropped before the runtime's own dlopen sees it.
extern "C" void* __interceptor_dlopen(const char* filename, int flags);
extern "C" void* dlopen(const char* filename, int flags) {
  return __interceptor_dlopen(filename, flags & ~RTLD_DEEPBIND);
}

namespace {

using namespace lazykv;

constexpr size_t kMaxTextBytes = 64 << 10;
constexpr int32_t kBos = 1, kEos = 2;  // both models' (Llama's) control ids

std::vector<std::unique_ptr<Tokenizer>> g_models;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  for (const char* file : {"tok512.model", "tok32000.model"}) {
    const std::string path = fuzz::ModelPath(file);
    if (path.empty()) continue;
    auto model = LoadSentencePieceTokenizer(path);
    if (!model.ok()) {
      std::fprintf(stderr, "sentencepiece_tokenizer_fuzzer: %s\n", model.status().ToString().c_str());
      std::abort();
    }
    g_models.push_back(*std::move(model));
  }
  if (g_models.empty()) {
    std::fprintf(stderr, "sentencepiece_tokenizer_fuzzer: no tok512.model or tok32000.model in the models folder "
                         "(LAZYKV_MODELS_DIR): nothing to fuzz\n");
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0 || size > kMaxTextBytes + 1) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0) {  // text
    for (const auto& model : g_models) {
      const std::vector<int32_t> ids = model->Encode(rest);
      for (int32_t id : ids) {
        FUZZ_CHECK(id >= 0 && id < model->vocab_size());
        FUZZ_CHECK(id != kBos && id != kEos);
      }
      (void)model->Decode(ids);
    }
  } else {  // ids
    std::vector<int32_t> ids(rest.size() / 4);
    if (!ids.empty()) std::memcpy(ids.data(), rest.data(), ids.size() * 4);
    if (data[0] & 2) {
      for (int32_t& id : ids) id %= 40000;
    }
    const size_t split = ids.empty() ? 0 : static_cast<uint8_t>(rest.back()) % (ids.size() + 1);
    for (const auto& model : g_models) fuzz::CheckDecode(*model, ids, split);
  }
  return 0;
}
