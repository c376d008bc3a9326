// The chat-template engine against the Llama 3 reference vectors
// (../shared/tokenizers/llama3/chat_vectors.jsonl, rendered by @huggingface/jinja and
// checked with Python Jinja2 under transformers' settings; see PROVENANCE.txt there): each
// rendered string exactly, and its ids when the project's tokenizer encodes it (special
// tokens parsed), which is what the worker will feed the model.
//
// Bugs these catch: the template not read from tokenizer_config.json (or bos_token read as
// the object instead of its text), `| trim` not applied or trimming the wrong characters,
// loop.index0 / `set` inside the loop leaking, add_generation_prompt not reaching the
// template, a newline lost or doubled by trim_blocks, special-token text in content handled
// differently from the reference.
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/test_util.h"
#include "worker/chat_template/chat_template.h"
#include "worker/tokenizer/tokenizer.h"

namespace lazykv {
namespace {

using json = nlohmann::json;

TEST(ChatTemplateVectorsTest, RendersEveryLlama3VectorExactlyWithTheSameIds) {
  const std::string dir = testing::Llama3TokenizerDir();
  if (dir.empty()) GTEST_SKIP() << "no ../shared/tokenizers/llama3";
  absl::StatusOr<ChatTemplate> package = ChatTemplate::FromTokenizerConfigFile(dir + "/tokenizer_config.json");
  ASSERT_TRUE(package.ok()) << package.status();
  EXPECT_EQ(package->bos_token(), "<|begin_of_text|>");
  EXPECT_EQ(package->eos_token(), "<|end_of_text|>");
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = LoadTokenizer(dir + "/tokenizer.json");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();

  const std::vector<json> vectors = testing::ReadJsonLines(dir + "/chat_vectors.jsonl");
  ASSERT_EQ(vectors.size(), 12u);
  int package_lines = 0, derived_lines = 0;
  for (const json& v : vectors) {
    SCOPED_TRACE(v["name"].get<std::string>());
    absl::StatusOr<ChatTemplate> own;
    const ChatTemplate* tpl = &*package;
    if (v["template_variant"] == "package") {
      ++package_lines;
      ASSERT_FALSE(v.contains("chat_template"));
    } else {
      ASSERT_EQ(v["template_variant"], "derived_conditional");
      ++derived_lines;
      own = ChatTemplate::FromString(v["chat_template"].get<std::string>(), v["bos_token"], v["eos_token"]);
      ASSERT_TRUE(own.ok()) << own.status();
      tpl = &*own;
    }
    ASSERT_EQ(v["bos_token"], tpl->bos_token());
    absl::StatusOr<std::string> rendered = tpl->Render(v["messages"], v["add_generation_prompt"].get<bool>());
    ASSERT_TRUE(rendered.ok()) << rendered.status();
    EXPECT_EQ(*rendered, v["rendered"].get<std::string>());
    EXPECT_EQ((*tokenizer)->Encode(*rendered), v["ids"].get<std::vector<int32_t>>());
  }
  EXPECT_EQ(package_lines, 7);
  EXPECT_EQ(derived_lines, 5);
}

// The derived template's add_generation_prompt really switches the assistant header: the
// vectors hold both settings for one conversation, and they must differ by exactly it.
TEST(ChatTemplateVectorsTest, DerivedTemplateHonoursAddGenerationPrompt) {
  const std::string dir = testing::Llama3TokenizerDir();
  if (dir.empty()) GTEST_SKIP() << "no ../shared/tokenizers/llama3";
  for (const json& v : testing::ReadJsonLines(dir + "/chat_vectors.jsonl")) {
    if (v["template_variant"] != "derived_conditional") continue;
    absl::StatusOr<ChatTemplate> tpl =
        ChatTemplate::FromString(v["chat_template"].get<std::string>(), v["bos_token"], v["eos_token"]);
    ASSERT_TRUE(tpl.ok()) << tpl.status();
    absl::StatusOr<std::string> with = tpl->Render(v["messages"], true);
    absl::StatusOr<std::string> without = tpl->Render(v["messages"], false);
    ASSERT_TRUE(with.ok() && without.ok());
    EXPECT_EQ(*with, *without + "<|start_header_id|>assistant<|end_header_id|>\n\n");
  }
}

}  // namespace
}  // namespace lazykv
