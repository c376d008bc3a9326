#include "worker/openai/chat_settings.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace lazykv {

absl::StatusOr<std::optional<ChatTemplate>> LoadChatTemplate(const std::string& flag,
                                                             const std::vector<std::string>& model_dirs) {
  namespace fs = std::filesystem;
  auto named = [](absl::StatusOr<ChatTemplate> loaded) -> absl::StatusOr<std::optional<ChatTemplate>> {
    if (!loaded.ok()) {
      return absl::Status(loaded.status().code(), absl::StrCat("--chat-template: ", loaded.status().message()));
    }
    return std::optional<ChatTemplate>(*std::move(loaded));
  };
  if (flag == "chatml") return named(ChatTemplate::FromString(kChatMlTemplate, "", "<|im_end|>"));
  if (!flag.empty()) {
    if (fs::path(flag).extension() == ".json") return named(ChatTemplate::FromTokenizerConfigFile(flag));
    std::ifstream in(flag);
    if (!in) return absl::NotFoundError(absl::StrCat("--chat-template: cannot read ", flag));
    std::stringstream text;
    text << in.rdbuf();
    return named(ChatTemplate::FromString(text.str()));
  }
  std::error_code ec;
  for (const std::string& dir : model_dirs) {
    if (dir.empty() || !fs::is_directory(dir, ec)) continue;
    if (!fs::exists(fs::path(dir) / "chat_template.jinja", ec) &&
        !fs::exists(fs::path(dir) / "tokenizer_config.json", ec)) {
      continue;
    }
    absl::StatusOr<ChatTemplate> loaded = ChatTemplate::FromModelDirectory(dir);
    if (loaded.ok() && loaded->is_fallback()) continue;  // a config without a template
    return named(std::move(loaded));
  }
  return std::optional<ChatTemplate>();
}

ChatSettings MakeChatSettings(const ChatTemplate* chat_template, const Tokenizer& tokenizer,
                              const std::vector<int32_t>& anchor) {
  ChatSettings settings;
  settings.chat_template = chat_template;
  if (chat_template == nullptr) return settings;
  const std::string& bos = chat_template->bos_token();
  if (!bos.empty() && tokenizer.Encode(bos) == anchor) settings.anchor_text = bos;
  auto add_if_one_token = [&](const std::string& text) {
    const std::vector<int32_t> ids = tokenizer.Encode(text);
    if (ids.size() == 1 && std::find(settings.end_of_turn_ids.begin(), settings.end_of_turn_ids.end(), ids[0]) ==
                               settings.end_of_turn_ids.end()) {
      settings.end_of_turn_ids.push_back(ids[0]);
    }
  };
  if (!chat_template->eos_token().empty()) add_if_one_token(chat_template->eos_token());
  for (const char* marker : {"<|eot_id|>", "<|im_end|>", "<|end|>", "<|eot|>"}) {
    if (chat_template->source().find(marker) != std::string::npos) add_if_one_token(marker);
  }
  return settings;
}

}  // namespace lazykv
