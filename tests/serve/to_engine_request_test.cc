// ToEngineRequest: a call abandoned while its texts are tokenized stops at the next text,
// the limits are checked before any tokenizing, and with a DocumentTokenCache a document
// text seen before is not tokenized again (the prompt always is).
#include <gtest/gtest.h>

#include "worker/serve/generation_service.h"

namespace lazykv {
namespace {

// Counts the texts it tokenizes (one id per byte).
class CountingTokenizer final : public Tokenizer {
 public:
  std::vector<int32_t> Encode(std::string_view text) const override {
    ++encoded;
    return std::vector<int32_t>(text.size(), 5);
  }
  std::string Decode(std::span<const int32_t> ids) const override { return std::string(ids.size(), 'x'); }
  int vocab_size() const override { return 16; }
  mutable int encoded = 0;
};

v1::GenerateRequest TextCall(int documents) {
  v1::GenerateRequest call;
  for (int d = 0; d < documents; ++d) call.add_documents()->set_text(std::string(100 + d, 'a'));
  call.set_prompt_text("question");
  return call;
}

TEST(ToEngineRequestTest, StopsTokenizingOnceTheCallIsNoLongerWanted) {
  CountingTokenizer tokenizer;
  int asked = 0;
  auto request = ToEngineRequest(TextCall(10), tokenizer, GenerationServiceOptions{}, [&]() -> absl::Status {
    return ++asked > 3 ? absl::CancelledError("client cancelled") : absl::OkStatus();
  });
  EXPECT_EQ(request.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(tokenizer.encoded, 3);  // documents 0-2; the fourth was never tokenized
}

TEST(ToEngineRequestTest, AWantedCallIsTokenizedWhole) {
  CountingTokenizer tokenizer;
  int asked = 0;
  auto request = ToEngineRequest(TextCall(4), tokenizer, GenerationServiceOptions{}, [&]() {
    ++asked;
    return absl::OkStatus();
  });
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_EQ(asked, 5);  // each document and the prompt
  ASSERT_EQ(request->docs.size(), 4u);
  EXPECT_EQ(request->docs[3].size(), 103u);
  EXPECT_EQ(request->prompt.size(), 8u);
}

TEST(ToEngineRequestTest, DocumentTextsSeenBeforeComeFromTheCache) {
  CountingTokenizer tokenizer;
  DocumentTokenCache cache(&tokenizer, 1 << 20);
  const GenerationServiceOptions options{.document_tokens = &cache};
  auto first = ToEngineRequest(TextCall(4), tokenizer, options);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(tokenizer.encoded, 5);  // 4 documents and the prompt
  auto second = ToEngineRequest(TextCall(4), tokenizer, options);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(tokenizer.encoded, 6) << "only the prompt tokenized again";
  EXPECT_EQ(second->docs, first->docs);
  EXPECT_EQ(second->prompt, first->prompt);
  EXPECT_EQ(cache.stats().hits, 4u);
}

TEST(ToEngineRequestTest, AnOversizedTextIsRefusedBeforeAnyTokenizing) {
  CountingTokenizer tokenizer;
  v1::GenerateRequest call = TextCall(3);
  call.mutable_documents(2)->set_text(std::string(2000, 'b'));
  auto request = ToEngineRequest(call, tokenizer, GenerationServiceOptions{.max_text_bytes = 1000});
  EXPECT_EQ(request.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(request.status().message().find("documents[2].text"), std::string::npos);
  EXPECT_EQ(tokenizer.encoded, 0);
}

}  // namespace
}  // namespace lazykv
