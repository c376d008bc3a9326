// Which chat template a worker uses and what follows from it: the text its anchor already
// stands for, and the end-of-turn tokens that end a chat reply.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/chat_template/chat_template.h"
#include "worker/openai/openai_request.h"
#include "worker/tokenizer/tokenizer.h"

namespace lazykv {

// `flag` (--chat-template): "chatml" (the built-in ChatML template), a
// tokenizer_config.json (any *.json), or a file holding the template itself. Empty: the
// template of the first of `model_dirs` that has one (chat_template.jinja or
// tokenizer_config.json), else none (nullopt: chat completions are refused).
absl::StatusOr<std::optional<ChatTemplate>> LoadChatTemplate(const std::string& flag,
                                                             const std::vector<std::string>& model_dirs);

// The template's bos_token text when it encodes to exactly the anchor (it is stripped from
// the rendered conversation), and the end-of-turn ids: the template's eos_token and any of
// <|eot_id|>, <|im_end|>, <|end|>, <|eot|> the template writes, each one token.
ChatSettings MakeChatSettings(const ChatTemplate* chat_template, const Tokenizer& tokenizer,
                              const std::vector<int32_t>& anchor);

}  // namespace lazykv
