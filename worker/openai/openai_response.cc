#include "worker/openai/openai_response.h"

namespace lazykv {
namespace {

using json = nlohmann::json;

bool IsChat(const ResponseIdentity& who) { return who.endpoint == OpenAiEndpoint::kChatCompletions; }

json Envelope(const ResponseIdentity& who, bool chunk) {
  const char* object = IsChat(who) ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
  return json{{"id", who.id}, {"object", object}, {"created", who.created}, {"model", who.model}};
}

json FinishReason(std::string_view reason) { return reason.empty() ? json(nullptr) : json(std::string(reason)); }

}  // namespace

json UsageJson(const Usage& usage, int completion_tokens) {
  return json{{"prompt_tokens", usage.prompt_tokens},
              {"completion_tokens", completion_tokens},
              {"total_tokens", usage.prompt_tokens + completion_tokens},
              {"prompt_tokens_details", {{"cached_tokens", usage.cached_tokens}}}};
}

json CompletionJson(const ResponseIdentity& who, const std::string& text, std::string_view finish_reason,
                    const Usage& usage, int completion_tokens) {
  json out = Envelope(who, /*chunk=*/false);
  json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", FinishReason(finish_reason)}};
  if (IsChat(who)) {
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  } else {
    choice["text"] = text;
  }
  out["choices"] = json::array({choice});
  out["usage"] = UsageJson(usage, completion_tokens);
  return out;
}

json ChunkJson(const ResponseIdentity& who, const std::string& text, bool first, std::string_view finish_reason) {
  json out = Envelope(who, /*chunk=*/true);
  json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", FinishReason(finish_reason)}};
  if (IsChat(who)) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || finish_reason.empty()) delta["content"] = text;
    choice["delta"] = std::move(delta);
  } else {
    choice["text"] = text;
  }
  out["choices"] = json::array({choice});
  return out;
}

json UsageChunkJson(const ResponseIdentity& who, const Usage& usage, int completion_tokens) {
  json out = Envelope(who, /*chunk=*/true);
  out["choices"] = json::array();
  out["usage"] = UsageJson(usage, completion_tokens);
  return out;
}

std::string ServerSentEvent(const json& data) {
  // Replacing invalid UTF-8 keeps one bad byte from aborting the stream (TextStream's
  // deltas are valid already).
  return "data: " + data.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

HttpError ErrorFor(const absl::Status& status) {
  int http = 500;
  std::string type = "internal_error";
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:
      http = 400, type = "invalid_request_error";
      break;
    case absl::StatusCode::kUnauthenticated:
      http = 401, type = "authentication_error";
      break;
    case absl::StatusCode::kPermissionDenied:
      http = 403, type = "permission_error";
      break;
    case absl::StatusCode::kNotFound:
      http = 404, type = "not_found_error";
      break;
    case absl::StatusCode::kResourceExhausted:
      http = 429, type = "rate_limit_error";
      break;
    case absl::StatusCode::kCancelled:
      http = 499, type = "cancelled";
      break;
    case absl::StatusCode::kUnavailable:
      http = 503, type = "service_unavailable";
      break;
    case absl::StatusCode::kDeadlineExceeded:
      http = 504, type = "timeout";
      break;
    default:
      break;
  }
  const std::string message(status.message());
  const std::string field = http == 400 || http == 404 ? FieldOfError(message) : "";
  return HttpError{http, json{{"error",
                               {{"message", message},
                                {"type", type},
                                {"param", field.empty() ? json(nullptr) : json(field)},
                                {"code", std::string(absl::StatusCodeToString(status.code()))}}}}};
}

}  // namespace lazykv
