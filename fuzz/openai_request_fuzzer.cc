// openai_request_fuzzer: the OpenAI-compatible API's body parsers
// (worker/openai/openai_request.h) over any bytes, for both endpoints, with the Llama 3
// chat template.
// Invariants (abort on violation):
// - every body gets a status: no exception, no crash, no undefined behaviour;
// - a refusal is INVALID_ARGUMENT (or RESOURCE_EXHAUSTED from the template's limits) and
//   names a field: its message starts with "FIELD: ";
// - what is accepted keeps the limits: at most max_documents documents, none empty, at
//   most max_stop_strings stop strings, max_tokens >= 0, and stream_options only with stream.
#include <string>
#include <string_view>

#include "fuzz/fuzz_util.h"
#include "worker/openai/openai_request.h"

namespace {

const lazykv::ChatTemplate& Llama3Template() {
  static const lazykv::ChatTemplate* chat = new lazykv::ChatTemplate(*lazykv::ChatTemplate::FromString(
      "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
      "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
      "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}"
      "{% endfor %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}",
      "<|begin_of_text|>", "<|end_of_text|>"));
  return *chat;
}

void Check(const absl::StatusOr<lazykv::OpenAiRequest>& parsed, const lazykv::OpenAiLimits& limits) {
  if (!parsed.ok()) {
    FUZZ_CHECK(parsed.status().code() == absl::StatusCode::kInvalidArgument ||
               parsed.status().code() == absl::StatusCode::kResourceExhausted);
    FUZZ_CHECK(!lazykv::FieldOfError(std::string(parsed.status().message())).empty());
    return;
  }
  const lazykv::v1::GenerateRequest& call = parsed->call;
  FUZZ_CHECK(call.documents_size() <= limits.max_documents);
  for (const auto& doc : call.documents()) FUZZ_CHECK(!doc.text().empty());
  FUZZ_CHECK(call.sampling().stop_size() <= limits.max_stop_strings);
  FUZZ_CHECK(call.sampling().max_tokens() >= 0);
  FUZZ_CHECK(!parsed->include_usage || parsed->stream);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (1 << 16)) return 0;
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  lazykv::OpenAiLimits limits;
  limits.max_documents = 8;
  lazykv::ChatSettings chat;
  chat.chat_template = &Llama3Template();
  chat.anchor_text = "<|begin_of_text|>";
  chat.end_of_turn_ids = {128009};
  try {
    Check(lazykv::ParseCompletionRequest(body, limits), limits);
    Check(lazykv::ParseChatRequest(body, chat, limits), limits);
  } catch (...) {
    FUZZ_CHECK(false && "a parser threw");
  }
  return 0;
}
