// request_json_fuzzer: the CLI's JSON request parser (worker/cli/request_json.h,
// ParseRequestJson), over nlohmann::json parsed from the input (invalid JSON is skipped:
// that is nlohmann's parser, not the project's).
//
// The tokenizer is the llama2.c one from ../shared/models/tok512.bin (LAZYKV_MODELS_DIR
// overrides the folder), or the byte tokenizer when that file is absent.
// Invariants (abort on violation):
// - ParseRequestJson returns a status for every JSON value: it never throws, and runs no
//   undefined behaviour (UBSan: e.g. a float out of int's range converted to an int);
// - what it accepts is a JSON object of known fields only; its docs and prompt are what
//   those fields hold (token ids as given; text as the tokenizer encodes it), and fields
//   that are absent keep the defaults.
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "fuzz/fuzz_util.h"
#include "worker/cli/request_json.h"
#include "worker/tokenizer/tokenizer.h"

namespace {

using namespace lazykv;
using nlohmann::json;

std::unique_ptr<Tokenizer> g_tokenizer;

GenerateRequest Defaults() {
  GenerateRequest d;
  d.docs = {{7, 8, 9}};
  d.prompt = {10, 11};
  d.sampling.max_tokens = 17;
  d.sampling.temperature = 0.5f;
  d.sampling.top_p = 0.75f;
  return d;
}

// The ids a docs entry or the prompt holds.
std::vector<int32_t> IdsOf(const json& value) {
  if (value.is_string()) {
    std::vector<int32_t> ids = g_tokenizer->Encode(value.get<std::string>());
    for (int32_t id : ids) FUZZ_CHECK(id >= 0 && id < g_tokenizer->vocab_size());
    return ids;
  }
  std::vector<int32_t> ids;
  for (const json& id : value) ids.push_back(id.get<int32_t>());
  return ids;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const std::string path = fuzz::ModelPath("tok512.bin"); !path.empty()) {
    auto tokenizer = LoadTokenizer(path);
    if (tokenizer.ok()) g_tokenizer = *std::move(tokenizer);
  }
  if (g_tokenizer == nullptr) {
    std::fprintf(stderr, "request_json_fuzzer: no tok512.bin in the models folder; using the byte tokenizer\n");
    g_tokenizer = *MakeByteTokenizer(512);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (1 << 16)) return 0;
  const json j = json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  const GenerateRequest defaults = Defaults();
  absl::StatusOr<GenerateRequest> request;
  try {
    request = ParseRequestJson(j, *g_tokenizer, defaults);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ParseRequestJson threw: %s\n", e.what());
    FUZZ_CHECK(false);
  } catch (...) {
    std::fprintf(stderr, "ParseRequestJson threw something not a std::exception\n");
    FUZZ_CHECK(false);
  }
  if (!request.ok()) {
    FUZZ_CHECK(request.status().code() == absl::StatusCode::kInvalidArgument);
    FUZZ_CHECK(!request.status().message().empty());
    return 0;
  }
  FUZZ_CHECK(j.is_object());
  for (const auto& [key, value] : j.items()) {
    FUZZ_CHECK(key == "docs" || key == "prompt" || key == "max_tokens" || key == "temperature" || key == "top_p" ||
               key == "seed" || key == "mode");
  }
  if (j.contains("docs")) {
    const json& docs = j["docs"];
    FUZZ_CHECK(docs.is_array() && request->docs.size() == docs.size());
    for (size_t d = 0; d < docs.size(); ++d) FUZZ_CHECK(request->docs[d] == IdsOf(docs[d]));
  } else {
    FUZZ_CHECK(request->docs == defaults.docs);
  }
  FUZZ_CHECK(request->prompt == (j.contains("prompt") ? IdsOf(j["prompt"]) : defaults.prompt));
  if (!j.contains("max_tokens")) FUZZ_CHECK(request->sampling.max_tokens == defaults.sampling.max_tokens);
  if (!j.contains("seed")) FUZZ_CHECK(!request->sampling.seed.has_value());
  if (!j.contains("mode")) FUZZ_CHECK(!request->mode.has_value());
  return 0;
}
