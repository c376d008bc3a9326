// OpenAI-compatible request bodies (POST /v1/completions, /v1/chat/completions) turned
// into the worker's own Generate call (proto/generate.proto), so that the HTTP API and the
// gRPC API tokenize, validate and run a request the same way.
//
// Extensions, as vLLM users know them:
// - `documents`: an array of strings, or of objects {"text": ..., "title": ...}; each
//   becomes one position-free chunk, placed after the anchor (BOS) and before the prompt
//   (the rendered conversation, or the completion prompt), in the order given. A title is
//   written before its text as "TITLE\n" (both are the chunk). A document's KV is reused by
//   every later request that holds the same document, in any order or position.
// - `stop_token_ids`: token ids that end the reply (besides the model's end-of-sequence
//   ids and, for chat, the template's end of turn).
// - `add_generation_prompt` (chat, default true), `mode` (benchmarks: lazy, block, prefix,
//   none).
// Fields OpenAI defines but this server does not implement are refused when set to
// anything but their neutral value (n, logprobs, echo, best_of, suffix, penalties,
// logit_bias, tools); unknown fields are ignored, as OpenAI's own server does.
//
// Every error is INVALID_ARGUMENT whose message starts with the offending field's path
// ("messages[2].content: ...").
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "proto/generate.pb.h"
#include "worker/chat_template/chat_template.h"

namespace lazykv {

enum class OpenAiEndpoint { kCompletions, kChatCompletions };

struct OpenAiRequest {
  OpenAiEndpoint endpoint = OpenAiEndpoint::kCompletions;
  std::string model;         // as the client named it
  v1::GenerateRequest call;  // documents, prompt, sampling, mode
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage: a last chunk with the usage
};

// What chat requests need from the model.
struct ChatSettings {
  const ChatTemplate* chat_template = nullptr;  // null: chat completions are refused
  // Text the anchor already stands for: removed from the front of the rendered
  // conversation (a template that writes bos_token itself would otherwise add a second BOS).
  std::string anchor_text;
  std::vector<int32_t> end_of_turn_ids;  // added to stop_token_ids (Llama 3: <|eot_id|>)
};

struct OpenAiLimits {
  int max_documents = 1024;
  int max_messages = 4096;
  int max_stop_strings = 16;
};

absl::StatusOr<OpenAiRequest> ParseCompletionRequest(std::string_view body, const OpenAiLimits& limits);
absl::StatusOr<OpenAiRequest> ParseChatRequest(std::string_view body, const ChatSettings& chat,
                                               const OpenAiLimits& limits);

// The field an INVALID_ARGUMENT message above names ("messages[2].content"), or "".
std::string FieldOfError(std::string_view message);

}  // namespace lazykv
