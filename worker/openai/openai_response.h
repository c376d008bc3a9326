// OpenAI-compatible response bodies: whole completions, server-sent-event chunks, the
// usage object (with prompt_tokens_details.cached_tokens: prompt tokens whose KV was
// reused) and error bodies {"error": {message, type, param, code}} with their HTTP status.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "nlohmann/json.hpp"
#include "worker/engine/engine.h"
#include "worker/openai/openai_request.h"

namespace lazykv {

// What every object of one response repeats.
struct ResponseIdentity {
  OpenAiEndpoint endpoint;
  std::string id;  // "cmpl-..." or "chatcmpl-..."
  int64_t created = 0;
  std::string model;
};

nlohmann::json UsageJson(const Usage& usage, int completion_tokens);

// The whole reply (stream: false).
nlohmann::json CompletionJson(const ResponseIdentity& who, const std::string& text, std::string_view finish_reason,
                              const Usage& usage, int completion_tokens);
// One streamed chunk: a text delta (the first chat chunk also carries the role), or the
// last one with a finish_reason and no text.
nlohmann::json ChunkJson(const ResponseIdentity& who, const std::string& text, bool first,
                         std::string_view finish_reason);
// The chunk stream_options.include_usage asks for: no choices, the usage.
nlohmann::json UsageChunkJson(const ResponseIdentity& who, const Usage& usage, int completion_tokens);

// "data: JSON\n\n".
std::string ServerSentEvent(const nlohmann::json& data);

struct HttpError {
  int status = 500;
  nlohmann::json body;
};
// The HTTP status and OpenAI error body for a failed request: 400 (naming the field as
// `param`), 401, 403, 404, 429, 499 (client went away), 503, 504, else 500.
HttpError ErrorFor(const absl::Status& status);

}  // namespace lazykv
