#include "worker/chat_template/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "common/status_macros.h"
#include "worker/chat_template/evaluator.h"
#include "worker/chat_template/parser.h"
#include "worker/chat_template/str_cat.h"
#include "worker/chat_template/value.h"

namespace lazykv {
namespace {

using jinja::Cat;

// Messages, tools and other request data nest at most this deep (a Value's functions recurse).
constexpr int kMaxJsonDepth = 64;

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(Cat("cannot open ", path));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

absl::StatusOr<nlohmann::json> ReadJson(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(Cat(path, ": not valid JSON"));
  return j;
}

// A special token's text: a string, or an AddedToken object's "content"; "" when absent.
absl::StatusOr<std::string> SpecialToken(const nlohmann::json& config, const char* key) {
  if (!config.contains(key) || config[key].is_null()) return std::string();
  const nlohmann::json& token = config[key];
  if (token.is_string()) return token.get<std::string>();
  if (token.is_object() && token.contains("content") && token["content"].is_string()) {
    return token["content"].get<std::string>();
  }
  return absl::InvalidArgumentError(
      Cat("tokenizer_config.json: ", key, " must be a string or an object with a string \"content\""));
}

absl::Status CheckDepth(const nlohmann::json& j, int depth) {
  if (depth > kMaxJsonDepth) {
    return absl::InvalidArgumentError(Cat("chat data nested deeper than ", kMaxJsonDepth, " levels"));
  }
  if (j.is_array() || j.is_object()) {
    for (const auto& item : j) RETURN_IF_ERROR(CheckDepth(item, depth + 1));
  }
  return absl::OkStatus();
}

// `content` as the template sees it: a string, null, or the texts of its parts joined.
absl::StatusOr<nlohmann::json> NormalizeContent(const nlohmann::json& content, size_t index) {
  if (!content.is_array()) {
    if (content.is_string() || content.is_null()) return content;
    return absl::InvalidArgumentError(
        Cat("messages[", index, "].content must be a string, null or an array of text parts"));
  }
  std::string joined;
  for (size_t p = 0; p < content.size(); ++p) {
    const nlohmann::json& part = content[p];
    if (!part.is_object() || !part.contains("type") || part["type"] != "text" || !part.contains("text") ||
        !part["text"].is_string()) {
      return absl::InvalidArgumentError(Cat("messages[", index, "].content[", p,
                                            "]: only {\"type\": \"text\", \"text\": string} parts are supported"));
    }
    if (p > 0) joined += "\n";
    joined += part["text"].get<std::string>();
  }
  return joined;
}

}  // namespace

absl::StatusOr<ChatTemplate> ChatTemplate::FromString(std::string_view source, std::string bos_token,
                                                      std::string eos_token) {
  ChatTemplate t;
  ASSIGN_OR_RETURN(t.program_, jinja::Parse(source));
  t.source_ = std::string(source);
  t.bos_token_ = std::move(bos_token);
  t.eos_token_ = std::move(eos_token);
  return t;
}

absl::StatusOr<ChatTemplate> ChatTemplate::FromTokenizerConfig(const nlohmann::json& config) {
  if (!config.is_object()) return absl::InvalidArgumentError("tokenizer_config.json: not a JSON object");
  if (!config.contains("chat_template") || config["chat_template"].is_null()) {
    return absl::NotFoundError("tokenizer_config.json has no chat_template");
  }
  const nlohmann::json& field = config["chat_template"];
  std::string source;
  if (field.is_string()) {
    source = field.get<std::string>();
  } else if (field.is_array()) {
    bool found = false;
    for (const nlohmann::json& named : field) {
      if (named.is_object() && named.value("name", "") == "default" && named.contains("template") &&
          named["template"].is_string()) {
        source = named["template"].get<std::string>();
        found = true;
      }
    }
    if (!found) {
      return absl::NotFoundError("tokenizer_config.json: chat_template is a list with no {\"name\": \"default\"}");
    }
  } else {
    return absl::InvalidArgumentError("tokenizer_config.json: chat_template must be a string or a list");
  }
  ASSIGN_OR_RETURN(std::string bos, SpecialToken(config, "bos_token"));
  ASSIGN_OR_RETURN(std::string eos, SpecialToken(config, "eos_token"));
  ASSIGN_OR_RETURN(ChatTemplate t, FromString(source, std::move(bos), std::move(eos)));
  ASSIGN_OR_RETURN(t.unk_token_, SpecialToken(config, "unk_token"));
  ASSIGN_OR_RETURN(t.pad_token_, SpecialToken(config, "pad_token"));
  return t;
}

absl::StatusOr<ChatTemplate> ChatTemplate::FromTokenizerConfigFile(const std::string& path) {
  ASSIGN_OR_RETURN(nlohmann::json config, ReadJson(path));
  absl::StatusOr<ChatTemplate> t = FromTokenizerConfig(config);
  if (!t.ok()) return absl::Status(t.status().code(), Cat(path, ": ", t.status().message()));
  return t;
}

absl::StatusOr<ChatTemplate> ChatTemplate::FromModelDirectory(const std::string& dir) {
  const std::string config_path = dir + "/tokenizer_config.json";
  const std::string jinja_path = dir + "/chat_template.jinja";
  nlohmann::json config = nlohmann::json::object();
  if (std::filesystem::exists(config_path)) {
    ASSIGN_OR_RETURN(config, ReadJson(config_path));
    if (!config.is_object()) return absl::InvalidArgumentError(config_path + ": not a JSON object");
  }
  if (std::filesystem::exists(jinja_path)) {
    ASSIGN_OR_RETURN(config["chat_template"], ReadFile(jinja_path));
  }
  const bool fallback = !config.contains("chat_template") || config["chat_template"].is_null();
  if (fallback) config["chat_template"] = std::string(kChatMlTemplate);
  absl::StatusOr<ChatTemplate> t = FromTokenizerConfig(config);
  if (!t.ok()) return absl::Status(t.status().code(), Cat(dir, ": ", t.status().message()));
  t->fallback_ = fallback;
  return t;
}

absl::StatusOr<std::string> ChatTemplate::Render(const nlohmann::json& messages, bool add_generation_prompt,
                                                 const nlohmann::json& extra) const {
  if (!messages.is_array()) return absl::InvalidArgumentError("messages must be a JSON array");
  if (!extra.is_object()) return absl::InvalidArgumentError("extra template variables must be a JSON object");
  RETURN_IF_ERROR(CheckDepth(messages, 0));
  RETURN_IF_ERROR(CheckDepth(extra, 0));
  nlohmann::json normalized = nlohmann::json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const nlohmann::json& message = messages[i];
    if (!message.is_object() || !message.contains("role") || !message["role"].is_string()) {
      return absl::InvalidArgumentError(Cat("messages[", i, "] must be an object with a string \"role\""));
    }
    nlohmann::json copy = message;
    if (message.contains("content")) {
      ASSIGN_OR_RETURN(copy["content"], NormalizeContent(message["content"], i));
    }
    normalized.push_back(std::move(copy));
  }
  jinja::Dict variables;
  variables.Set("bos_token", jinja::Value::String(bos_token_));
  variables.Set("eos_token", jinja::Value::String(eos_token_));
  variables.Set("unk_token", jinja::Value::String(unk_token_));
  variables.Set("pad_token", jinja::Value::String(pad_token_));
  variables.Set("tools", jinja::Value::None());
  variables.Set("documents", jinja::Value::None());
  for (const auto& [key, value] : extra.items()) {
    if (key == "messages" || key == "add_generation_prompt") {
      return absl::InvalidArgumentError(Cat("extra template variables may not set '", key, "'"));
    }
    variables.Set(key, jinja::Value::FromJson(value));
  }
  variables.Set("messages", jinja::Value::FromJson(normalized));
  variables.Set("add_generation_prompt", jinja::Value::Bool(add_generation_prompt));
  return jinja::Render(*program_, variables, limits_);
}

absl::StatusOr<std::string> ChatTemplate::Render(const std::vector<ChatMessage>& messages,
                                                 bool add_generation_prompt) const {
  nlohmann::json array = nlohmann::json::array();
  for (const ChatMessage& m : messages) array.push_back({{"role", m.role}, {"content", m.content}});
  return Render(array, add_generation_prompt);
}

}  // namespace lazykv
