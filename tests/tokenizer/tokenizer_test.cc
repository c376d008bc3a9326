// Tokenizers round-trip real text, agree with each other, and reject bad files.
#include "worker/tokenizer/tokenizer.h"

#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace lazykv::testing {
namespace {

const std::vector<std::string> kTexts = {
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park.",
    "Tom said, \"Can I have the red ball?\" His mom smiled and said yes!",
    "The cat sat on the mat.\nThen it slept for 3 hours, maybe 4.",
    "  two leading spaces, tabs\tand trailing space ",
    "Caf\xc3\xa9 na\xc3\xafve \xe2\x80\x94 emoji \xf0\x9f\x99\x82 and \xe4\xb8\xad\xe6\x96\x87",
};

// SentencePiece's normalizer collapses runs of whitespace by design, so the text with
// extra spaces round-trips exactly only through the llama2.c tokenizer.
void ExpectRoundTrips(const Tokenizer& tokenizer, bool normalizes_whitespace = false) {
  for (const std::string& text : kTexts) {
    if (normalizes_whitespace && text.starts_with("  ")) {
      EXPECT_EQ(tokenizer.Decode(tokenizer.Encode(text)), "two leading spaces, tabs\tand trailing space");
      continue;
    }
    const auto ids = tokenizer.Encode(text);
    EXPECT_FALSE(ids.empty());
    for (int32_t id : ids) EXPECT_TRUE(id >= 0 && id < tokenizer.vocab_size());
    EXPECT_EQ(tokenizer.Decode(ids), text);
  }
  EXPECT_TRUE(tokenizer.Encode("").empty());
}

TEST(TokenizerTest, Llama2cTokenizerRoundTrips) {
  if (!HaveModel("tok512.bin")) GTEST_SKIP() << "no ../shared/models";
  auto tokenizer = LoadTokenizer(ModelPath("tok512.bin"));
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ((*tokenizer)->vocab_size(), 512);
  ExpectRoundTrips(**tokenizer);
  // Merges happen: real words take fewer tokens than characters.
  EXPECT_LT((*tokenizer)->Encode(kTexts[0]).size(), kTexts[0].size() / 2);
}

TEST(TokenizerTest, SentencePieceTokenizerRoundTripsAndAgreesWithLlama2c) {
  if (!HaveModel("tok512.model") || !HaveModel("tok512.bin")) GTEST_SKIP() << "no ../shared/models";
  auto sp = LoadTokenizer(ModelPath("tok512.model"));
  auto bin = LoadTokenizer(ModelPath("tok512.bin"));
  ASSERT_TRUE(sp.ok()) << sp.status();
  ASSERT_TRUE(bin.ok());
  ExpectRoundTrips(**sp, /*normalizes_whitespace=*/true);
  // Two independent implementations of the same vocabulary give the same ids on ASCII text.
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ((*sp)->Encode(kTexts[i]), (*bin)->Encode(kTexts[i])) << kTexts[i];
}

TEST(TokenizerTest, ByteTokenizerRoundTrips) {
  auto tokenizer = MakeByteTokenizer(512);
  ASSERT_TRUE(tokenizer.ok());
  ExpectRoundTrips(**tokenizer);
  EXPECT_FALSE(MakeByteTokenizer(100).ok());
}

TEST(TokenizerTest, ContinuationKeepsTheSpaceBetweenPromptAndReply) {
  if (!HaveModel("tok512.bin")) GTEST_SKIP() << "no ../shared/models";
  auto tokenizer = LoadTokenizer(ModelPath("tok512.bin"));
  ASSERT_TRUE(tokenizer.ok());
  const auto prompt = (*tokenizer)->Encode("Once upon");
  const auto reply = (*tokenizer)->Encode("a time");
  EXPECT_EQ(DecodeContinuation(**tokenizer, prompt, reply), " a time");
}

TEST(TokenizerTest, RejectsBadFiles) {
  if (!HaveModel("tok512.bin")) GTEST_SKIP() << "no ../shared/models";
  std::ifstream in(ModelPath("tok512.bin"), std::ios::binary);
  const std::string good((std::istreambuf_iterator<char>(in)), {});
  const std::string path = (std::filesystem::temp_directory_path() / ("tok_" + std::to_string(FreshSeed()))).string();
  auto check = [&](const std::string& bytes, const std::string& needle, const std::string& file) {
    std::ofstream(file, std::ios::binary).write(bytes.data(), bytes.size());
    auto t = LoadTokenizer(file);
    ASSERT_FALSE(t.ok());
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << t.status();
    EXPECT_NE(t.status().message().find(file), std::string::npos) << t.status();
    EXPECT_NE(t.status().message().find(needle), std::string::npos) << t.status();
  };
  check(good.substr(0, good.size() - 3), "truncated", path + ".bin");
  check(good.substr(0, 2), "truncated", path + ".bin");
  check(std::string("\x00\x00\x00\x80", 4) + good.substr(4), "max_token_length", path + ".bin");
  check(good.substr(0, 400), "truncated", path + ".bin");
  check("this is not a sentencepiece model", "SentencePiece", path + ".model");
  std::filesystem::remove(path + ".bin");
  std::filesystem::remove(path + ".model");
  EXPECT_EQ(LoadTokenizer(path + ".missing").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace lazykv::testing
