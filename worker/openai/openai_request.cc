#include "worker/openai/openai_request.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace lazykv {
namespace {

using json = nlohmann::json;

absl::Status Bad(std::string_view field, std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(std::string(field), ": ", std::string(what)));
}

bool Present(const json& body, const char* field) { return body.contains(field) && !body[field].is_null(); }

absl::StatusOr<json> ParseObject(std::string_view body) {
  json parsed = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) return Bad("body", "not valid JSON");
  if (!parsed.is_object()) return Bad("body", "must be a JSON object");
  return parsed;
}

absl::StatusOr<double> Number(const json& body, const char* field, double lo, double hi) {
  const json& v = body[field];
  if (!v.is_number()) return Bad(field, "must be a number");
  const double x = v.get<double>();
  if (!std::isfinite(x) || x < lo || x > hi) return Bad(field, absl::StrFormat("%g is outside [%g, %g]", x, lo, hi));
  return x;
}

absl::StatusOr<int64_t> Integer(const json& v, std::string_view field, int64_t lo, int64_t hi) {
  if (!v.is_number_integer()) return Bad(field, "must be an integer");
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return Bad(field, absl::StrFormat("must be at most %d", hi));
  }
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi) return Bad(field, absl::StrFormat("%d is outside [%d, %d]", x, lo, hi));
  return x;
}

// A field that must keep its neutral value here (a feature not implemented).
absl::Status RefuseUnlessNeutral(const json& body, const char* field, const json& neutral, std::string_view why) {
  if (!Present(body, field) || body[field] == neutral) return absl::OkStatus();
  if (neutral.is_object() && body[field].is_object() && body[field].empty()) return absl::OkStatus();
  return Bad(field, why);
}

// Fields both endpoints share: model, sampling, streaming, documents, extensions.
absl::Status ParseCommon(const json& body, bool chat, const OpenAiLimits& limits, OpenAiRequest& out) {
  if (!body.contains("model") || !body["model"].is_string()) return Bad("model", "a model name (string) is required");
  out.model = body["model"].get<std::string>();
  v1::SamplingParams& s = *out.call.mutable_sampling();
  // max_completion_tokens replaces max_tokens in the chat API; either is accepted.
  for (const char* field : {"max_tokens", "max_completion_tokens"}) {
    if (!Present(body, field)) continue;
    auto n = Integer(body[field], field, 1, std::numeric_limits<int32_t>::max());
    if (!n.ok()) return n.status();
    s.set_max_tokens(static_cast<int32_t>(*n));
  }
  if (Present(body, "temperature")) {
    auto t = Number(body, "temperature", 0, 2);
    if (!t.ok()) return t.status();
    s.set_temperature(static_cast<float>(*t));
  }
  if (Present(body, "top_p")) {
    auto p = Number(body, "top_p", 0, 1);
    if (!p.ok()) return p.status();
    if (*p == 0) return Bad("top_p", "must be greater than 0");
    s.set_top_p(static_cast<float>(*p));
  }
  if (Present(body, "seed")) {
    auto seed = Integer(body["seed"], "seed", 0, std::numeric_limits<int64_t>::max());
    if (!seed.ok()) return seed.status();
    s.set_seed(static_cast<uint64_t>(*seed));
  }
  if (Present(body, "stop")) {
    const json& stop = body["stop"];
    if (stop.is_string()) {
      s.add_stop(stop.get<std::string>());
    } else if (stop.is_array()) {
      if (static_cast<int>(stop.size()) > limits.max_stop_strings) {
        return Bad("stop", absl::StrFormat("%d stop strings, at most %d", stop.size(), limits.max_stop_strings));
      }
      for (size_t i = 0; i < stop.size(); ++i) {
        if (!stop[i].is_string()) return Bad(absl::StrFormat("stop[%d]", i), "must be a string");
        s.add_stop(stop[i].get<std::string>());
      }
    } else {
      return Bad("stop", "must be a string or an array of strings");
    }
  }
  if (Present(body, "stop_token_ids")) {
    const json& ids = body["stop_token_ids"];
    if (!ids.is_array()) return Bad("stop_token_ids", "must be an array of token ids");
    for (size_t i = 0; i < ids.size(); ++i) {
      auto id = Integer(ids[i], absl::StrFormat("stop_token_ids[%d]", i), 0, std::numeric_limits<int32_t>::max());
      if (!id.ok()) return id.status();
      s.add_stop_token_ids(static_cast<int32_t>(*id));
    }
  }
  if (Present(body, "n")) {
    auto n = Integer(body["n"], "n", 1, 1);
    if (!n.ok()) return Bad("n", "only n = 1 is supported: send one request per completion");
  }
  if (Present(body, "stream")) {
    if (!body["stream"].is_boolean()) return Bad("stream", "must be true or false");
    out.stream = body["stream"].get<bool>();
  }
  if (Present(body, "stream_options")) {
    const json& options = body["stream_options"];
    if (!options.is_object()) return Bad("stream_options", "must be an object");
    if (!out.stream) return Bad("stream_options", "is only allowed with stream: true");
    if (options.contains("include_usage")) {
      if (!options["include_usage"].is_boolean()) return Bad("stream_options.include_usage", "must be true or false");
      out.include_usage = options["include_usage"].get<bool>();
    }
  }
  if (Present(body, "mode")) {
    if (!body["mode"].is_string()) return Bad("mode", "must be one of lazy, block, prefix, none");
    out.call.set_mode(body["mode"].get<std::string>());
  }
  if (Present(body, "repair_tokens")) {
    if (!body["repair_tokens"].is_number_integer() || body["repair_tokens"].get<int64_t>() < 0 ||
        body["repair_tokens"].get<int64_t>() > INT32_MAX) {
      return Bad("repair_tokens", "must be a non-negative integer");
    }
    out.call.set_repair_tokens(static_cast<int32_t>(body["repair_tokens"].get<int64_t>()));
  }
  for (const auto& [field, neutral] :
       std::initializer_list<std::pair<const char*, json>>{{"logprobs", chat ? json(false) : json(nullptr)},
                                                           {"top_logprobs", json(0)},
                                                           {"presence_penalty", json(0)},
                                                           {"frequency_penalty", json(0)},
                                                           {"logit_bias", json::object()},
                                                           {"best_of", json(1)},
                                                           {"echo", json(false)},
                                                           {"suffix", json("")},
                                                           {"tools", json::array()},
                                                           {"response_format", json{{"type", "text"}}}}) {
    if (absl::Status s = RefuseUnlessNeutral(body, field, neutral, "is not supported by this server"); !s.ok()) {
      return s;
    }
  }
  if (Present(body, "documents")) {
    const json& docs = body["documents"];
    if (!docs.is_array()) return Bad("documents", "must be an array of strings or of {text, title} objects");
    if (static_cast<int>(docs.size()) > limits.max_documents) {
      return Bad("documents", absl::StrFormat("%d documents, at most %d", docs.size(), limits.max_documents));
    }
    for (size_t d = 0; d < docs.size(); ++d) {
      const std::string field = absl::StrFormat("documents[%d]", d);
      std::string text;
      if (docs[d].is_string()) {
        text = docs[d].get<std::string>();
      } else if (docs[d].is_object()) {
        if (!docs[d].contains("text") || !docs[d]["text"].is_string())
          return Bad(field + ".text", "a string is required");
        text = docs[d]["text"].get<std::string>();
        if (Present(docs[d], "title")) {
          if (!docs[d]["title"].is_string()) return Bad(field + ".title", "must be a string");
          text = absl::StrCat(docs[d]["title"].get<std::string>(), "\n", text);
        }
      } else {
        return Bad(field, "must be a string or an object with a text field");
      }
      if (text.empty()) return Bad(field, "is empty");
      out.call.add_documents()->set_text(std::move(text));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<OpenAiRequest> ParseCompletionRequest(std::string_view text, const OpenAiLimits& limits) {
  absl::StatusOr<json> body = ParseObject(text);
  if (!body.ok()) return body.status();
  OpenAiRequest out;
  out.endpoint = OpenAiEndpoint::kCompletions;
  if (absl::Status s = ParseCommon(*body, /*chat=*/false, limits, out); !s.ok()) return s;
  if (!Present(*body, "prompt")) return Bad("prompt", "is required (a string or an array of token ids)");
  json prompt = (*body)["prompt"];
  // A one-element batch is the prompt itself; larger batches are n > 1 in disguise.
  if (prompt.is_array() && prompt.size() == 1 && (prompt[0].is_string() || prompt[0].is_array())) {
    prompt = json(prompt[0]);
  }
  if (prompt.is_string()) {
    out.call.set_prompt_text(prompt.get<std::string>());
  } else if (prompt.is_array() && !prompt.empty() && prompt[0].is_number()) {
    for (size_t i = 0; i < prompt.size(); ++i) {
      auto id = Integer(prompt[i], absl::StrFormat("prompt[%d]", i), 0, std::numeric_limits<int32_t>::max());
      if (!id.ok()) return id.status();
      out.call.mutable_prompt_tokens()->add_ids(static_cast<int32_t>(*id));
    }
  } else if (prompt.is_array() && !prompt.empty()) {
    return Bad("prompt", "a batch of prompts is not supported: send one request per prompt");
  } else {
    return Bad("prompt", "must be a string or a non-empty array of token ids");
  }
  if (out.call.prompt_text().empty() && out.call.prompt_case() == v1::GenerateRequest::kPromptText &&
      out.call.documents_size() == 0) {
    return Bad("prompt", "is empty and there are no documents");
  }
  return out;
}

absl::StatusOr<OpenAiRequest> ParseChatRequest(std::string_view text, const ChatSettings& chat,
                                               const OpenAiLimits& limits) {
  absl::StatusOr<json> body = ParseObject(text);
  if (!body.ok()) return body.status();
  OpenAiRequest out;
  out.endpoint = OpenAiEndpoint::kChatCompletions;
  if (absl::Status s = ParseCommon(*body, /*chat=*/true, limits, out); !s.ok()) return s;
  if (!body->contains("messages") || !(*body)["messages"].is_array() || (*body)["messages"].empty()) {
    return Bad("messages", "a non-empty array of messages is required");
  }
  const json& messages = (*body)["messages"];
  if (static_cast<int>(messages.size()) > limits.max_messages) {
    return Bad("messages", absl::StrFormat("%d messages, at most %d", messages.size(), limits.max_messages));
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string field = absl::StrFormat("messages[%d]", i);
    const json& m = messages[i];
    if (!m.is_object()) return Bad(field, "must be an object with role and content");
    if (!m.contains("role") || !m["role"].is_string()) return Bad(field + ".role", "a string is required");
    const std::string role = m["role"].get<std::string>();
    if (role != "system" && role != "user" && role != "assistant" && role != "tool" && role != "developer") {
      return Bad(field + ".role", absl::StrCat("'", role, "' is not one of system, developer, user, assistant, tool"));
    }
    if (!m.contains("content") || !(m["content"].is_string() || m["content"].is_array() || m["content"].is_null())) {
      return Bad(field + ".content", "must be a string or an array of text parts");
    }
    // OpenAI allows null content only on an assistant's message (one that made tool calls);
    // elsewhere the chat template would fail on it with an error naming no field.
    if (m["content"].is_null() && role != "assistant") {
      return Bad(field + ".content", "must be a string or an array of text parts (null only for an assistant)");
    }
  }
  bool add_generation_prompt = true;
  if (Present(*body, "add_generation_prompt")) {
    if (!(*body)["add_generation_prompt"].is_boolean()) return Bad("add_generation_prompt", "must be true or false");
    add_generation_prompt = (*body)["add_generation_prompt"].get<bool>();
  }
  if (chat.chat_template == nullptr) {
    return Bad("messages",
               "this model has no chat template: use /v1/completions, or start the worker with --chat-template");
  }
  absl::StatusOr<std::string> rendered = chat.chat_template->Render(messages, add_generation_prompt);
  if (!rendered.ok()) {
    return absl::Status(rendered.status().code(),
                        absl::StrCat("messages: the chat template refused them: ", rendered.status().message()));
  }
  std::string prompt = *std::move(rendered);
  if (!chat.anchor_text.empty() && prompt.starts_with(chat.anchor_text)) prompt.erase(0, chat.anchor_text.size());
  out.call.set_prompt_text(std::move(prompt));
  for (int32_t id : chat.end_of_turn_ids) out.call.mutable_sampling()->add_stop_token_ids(id);
  return out;
}

std::string FieldOfError(std::string_view message) {
  const size_t colon = message.find(':');
  if (colon == std::string_view::npos || colon == 0) return "";
  const std::string_view field = message.substr(0, colon);
  return field.find(' ') == std::string_view::npos ? std::string(field) : "";
}

}  // namespace lazykv
