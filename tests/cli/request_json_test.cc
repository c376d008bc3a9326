// The CLI's JSON lines are valid JSON whatever the tokens decode to: a lone byte-fallback
// token (an incomplete UTF-8 character) used to make nlohmann throw type_error.316. The
// text is what a stream shows (worker/tokenizer/text_stream.h).
#include "worker/cli/request_json.h"

#include <gtest/gtest.h>

#include "tests/test_util.h"

namespace lazykv {
namespace {

TEST(RequestJsonTest, ResultLinesAreValidJsonEvenForBrokenUtf8) {
  if (!testing::HaveModel("tok512.bin")) GTEST_SKIP() << "no ../shared/models";
  auto tokenizer = LoadTokenizer(testing::ModelPath("tok512.bin"));
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  // llama2.c byte-fallback ids: 3 + byte. 0xF8 is never valid UTF-8; 0xE2 0x82 is the start
  // of a three-byte character cut short.
  const std::vector<std::vector<int32_t>> outputs = {{3 + 0xF8}, {3 + 0xE2, 3 + 0x82}, {3 + 'h', 3 + 'i'}};
  for (const std::vector<int32_t>& tokens : outputs) {
    GenerateRequest request;
    GenerateResult result;
    result.prompt_token_ids = {1, 3 + 'a'};
    result.tokens = tokens;
    result.logprobs.assign(tokens.size(), -1.0f);
    result.finish_reason = "length";
    const std::string line = ResultToJsonLine(request, result, **tokenizer);
    const nlohmann::json parsed = nlohmann::json::parse(line);  // throws if invalid
    EXPECT_EQ(parsed["tokens"].get<std::vector<int32_t>>(), tokens);
    const std::string text = parsed["text"].get<std::string>();
    // The text a stream would have shown: one U+FFFD per ill-formed sequence, so the plain
    // dump() (which threw type_error.316 on raw bytes) works too.
    EXPECT_EQ(text, tokens[0] == 3 + 'h' ? "hi" : "\xEF\xBF\xBD") << line;
    EXPECT_NO_THROW(ResultToJson(request, result, **tokenizer).dump());
  }
}

}  // namespace
}  // namespace lazykv
