// chat_template_fuzzer: the Jinja subset (worker/chat_template/) over any template text,
// rendered with a fixed conversation under small limits.
// Invariants (abort on violation):
// - loading and rendering return a status for every input: no exception, no crash, no
//   undefined behaviour (ASan, UBSan), no hang (the limits bound loops and output);
// - a refusal is INVALID_ARGUMENT (the template's fault) or RESOURCE_EXHAUSTED (a limit),
//   with a message;
// - an output never exceeds the output limit.
#include <string>
#include <string_view>

#include "fuzz/fuzz_util.h"
#include "nlohmann/json.hpp"
#include "worker/chat_template/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using lazykv::ChatTemplate;
  if (size > (1 << 14)) return 0;
  const std::string_view source(reinterpret_cast<const char*>(data), size);
  auto check_refusal = [](const absl::Status& status) {
    FUZZ_CHECK(status.code() == absl::StatusCode::kInvalidArgument ||
               status.code() == absl::StatusCode::kResourceExhausted);
    FUZZ_CHECK(!status.message().empty());
  };
  absl::StatusOr<ChatTemplate> loaded;
  try {
    loaded = ChatTemplate::FromString(source, "<s>", "</s>");
  } catch (...) {
    FUZZ_CHECK(false && "FromString threw");
  }
  if (!loaded.ok()) {
    check_refusal(loaded.status());
    return 0;
  }
  lazykv::jinja::RenderLimits limits;
  limits.max_output_bytes = 1 << 16;
  limits.max_iterations = 1 << 12;
  loaded->set_limits(limits);
  const nlohmann::json messages = nlohmann::json::parse(
      R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": " Hi {{ x }} <|eot_id|> "},
          {"role": "assistant", "content": [{"type": "text", "text": "Hello"}]}])");
  for (bool add_generation_prompt : {false, true}) {
    absl::StatusOr<std::string> rendered;
    try {
      rendered = loaded->Render(messages, add_generation_prompt);
    } catch (...) {
      FUZZ_CHECK(false && "Render threw");
    }
    if (!rendered.ok()) {
      check_refusal(rendered.status());
      continue;
    }
    FUZZ_CHECK(rendered->size() <= limits.max_output_bytes);
  }
  return 0;
}
