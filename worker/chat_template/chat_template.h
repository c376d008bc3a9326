// Chat templates: turns a conversation into the prompt text a chat model was trained on,
// by rendering the model's Hugging Face `chat_template` (Jinja2) as transformers'
// apply_chat_template(tokenize=False) does, with this project's own Jinja subset engine
// (worker/chat_template/parser.h lists what it supports; anything else is refused when
// the template is loaded, with the construct and its line).
//
// Rendering sees the variables transformers passes: `messages`, `add_generation_prompt`,
// `tools` and `documents` (None unless given in `extra`), the special tokens of the
// tokenizer_config.json (`bos_token`, `eos_token`, `unk_token`, `pad_token`: text, "" when
// absent), and the `extra` variables, which override the special tokens.
//
// Messages are JSON objects with a string `role`; every field is passed to the template
// as is, except `content`, which may be a string, null, or an OpenAI-style array of parts:
// the texts of its {"type": "text", "text": ...} parts are joined with "\n" into one string
// before rendering (as vLLM does for text-only templates); any other part type is
// INVALID_ARGUMENT.
//
// The rendered text holds special tokens as text ("<|begin_of_text|>", ...): encode it with
// special tokens parsed, and add no BOS of your own when the template writes one.
//
// Immutable after loading: Render may be called from any number of threads at once.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "worker/chat_template/limits.h"

namespace lazykv {

namespace jinja {
struct Program;
}

// The ChatML template (Qwen, many fine-tunes): for a model directory without a template.
inline constexpr std::string_view kChatMlTemplate =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + "
    "'\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

struct ChatMessage {
  std::string role;
  std::string content;
};

class ChatTemplate {
 public:
  // A template string and the special tokens it may print.
  static absl::StatusOr<ChatTemplate> FromString(std::string_view source, std::string bos_token = "",
                                                 std::string eos_token = "");
  // A parsed tokenizer_config.json: its `chat_template` (a string, or a list of
  // {"name", "template"} from which "default" is used) and its special tokens (strings,
  // or objects with a "content" string). NOT_FOUND when it has no chat_template.
  static absl::StatusOr<ChatTemplate> FromTokenizerConfig(const nlohmann::json& config);
  static absl::StatusOr<ChatTemplate> FromTokenizerConfigFile(const std::string& path);
  // A Hugging Face model directory: chat_template.jinja if present (as transformers
  // prefers it), else tokenizer_config.json's chat_template, else kChatMlTemplate
  // (is_fallback() then says so); special tokens from tokenizer_config.json when present.
  static absl::StatusOr<ChatTemplate> FromModelDirectory(const std::string& dir);

  // The prompt text for `messages` (a JSON array of message objects, see above).
  // INVALID_ARGUMENT for malformed messages, a template error or raise_exception() (the
  // message says which and where; jinja::RaisedMessage gives the template's own text),
  // RESOURCE_EXHAUSTED past `limits` (16 MiB of output by default).
  absl::StatusOr<std::string> Render(const nlohmann::json& messages, bool add_generation_prompt,
                                     const nlohmann::json& extra = nlohmann::json::object()) const;
  absl::StatusOr<std::string> Render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;

  const std::string& source() const { return source_; }
  const std::string& bos_token() const { return bos_token_; }
  const std::string& eos_token() const { return eos_token_; }
  bool is_fallback() const { return fallback_; }
  // Before the template is shared between threads (it is the one mutation).
  void set_limits(const jinja::RenderLimits& limits) { limits_ = limits; }

 private:
  ChatTemplate() = default;

  std::shared_ptr<const jinja::Program> program_;
  std::string source_;
  std::string bos_token_, eos_token_, unk_token_, pad_token_;
  bool fallback_ = false;
  jinja::RenderLimits limits_;
};

}  // namespace lazykv
