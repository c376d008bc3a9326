// The llama2.c tokenizer's heap-driven merges against run.c's algorithm written plainly
// here (scan every adjacent pair, merge the best, repeat), on random text over each
// trained vocabulary: the same ids, merge for merge, including ties and byte fallback.
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/test_util.h"
#include "worker/tokenizer/tokenizer.h"

namespace lazykv::testing {
namespace {

// run.c's encode, from its tokenizer.bin, quadratic and obvious.
class RunCReference {
 public:
  explicit RunCReference(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    int32_t max_len = 0;
    in.read(reinterpret_cast<char*>(&max_len), 4);
    float score;
    int32_t len;
    while (in.read(reinterpret_cast<char*>(&score), 4) && in.read(reinterpret_cast<char*>(&len), 4)) {
      std::string piece(len, '\0');
      in.read(piece.data(), len);
      ids_.emplace(piece, static_cast<int32_t>(pieces_.size()));  // first wins
      pieces_.push_back(piece);
      scores_.push_back(score);
    }
  }
  int Lookup(const std::string& s) const {
    auto it = ids_.find(s);
    return it == ids_.end() ? -1 : it->second;
  }
  std::vector<int32_t> Encode(const std::string& text) const {
    std::vector<int32_t> tokens;
    if (text.empty()) return tokens;
    if (Lookup(" ") >= 0) tokens.push_back(Lookup(" "));
    for (size_t i = 0; i < text.size();) {
      size_t len = 1;
      while (len < 4 && i + len < text.size() && (static_cast<uint8_t>(text[i + len]) & 0xC0) == 0x80) ++len;
      const int id = Lookup(text.substr(i, len));
      if (id >= 0) {
        tokens.push_back(id);
      } else {
        for (size_t b = 0; b < len; ++b) tokens.push_back(static_cast<uint8_t>(text[i + b]) + 3);
      }
      i += len;
    }
    while (true) {
      float best_score = -1e10f;
      int best_id = -1, best_index = -1;
      for (size_t i = 0; i + 1 < tokens.size(); ++i) {
        const int id = Lookup(pieces_[tokens[i]] + pieces_[tokens[i + 1]]);
        if (id >= 0 && scores_[id] > best_score) {
          best_score = scores_[id];
          best_id = id;
          best_index = static_cast<int>(i);
        }
      }
      if (best_id < 0) break;
      tokens[best_index] = best_id;
      tokens.erase(tokens.begin() + best_index + 1);
    }
    return tokens;
  }

 private:
  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::map<std::string, int32_t> ids_;
};

// Text that exercises merges, repeats (equal scores at several places), whitespace runs
// and multi-byte code points outside small vocabularies (byte fallback).
std::string RandomText(std::mt19937_64& rng, int words) {
  static const std::vector<std::string> kWords = {"the",
                                                  "a",
                                                  "Lily",
                                                  "little",
                                                  "girl",
                                                  "played",
                                                  "ball",
                                                  "and",
                                                  "said",
                                                  ",",
                                                  ".",
                                                  "!",
                                                  "banana",
                                                  "aaaa",
                                                  "     ",
                                                  "\n",
                                                  "\t",
                                                  "Caf\xc3\xa9",
                                                  "\xe4\xb8\xad\xe6\x96\x87",
                                                  "\xf0\x9f\x99\x82",
                                                  "123",
                                                  "x",
                                                  "zz",
                                                  "\x80",
                                                  "ing",
                                                  "tion"};
  std::string text;
  for (int w = 0; w < words; ++w) {
    if (rng() % 3 != 0) text += ' ';
    text += kWords[rng() % kWords.size()];
    if (rng() % 7 == 0) text += static_cast<char>('a' + rng() % 26);
  }
  return text;
}

class Llama2cBpeTest : public ::testing::TestWithParam<std::string> {};

TEST_P(Llama2cBpeTest, SameIdsAsRunCOnRandomText) {
  if (!HaveModel(GetParam())) GTEST_SKIP() << "no " << GetParam();
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  auto tokenizer = LoadTokenizer(ModelPath(GetParam()));
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const RunCReference reference(ModelPath(GetParam()));
  for (int round = 0; round < 60; ++round) {
    const std::string text = RandomText(rng, 1 + static_cast<int>(rng() % 60));
    ASSERT_EQ((*tokenizer)->Encode(text), reference.Encode(text)) << "text: " << text;
  }
  EXPECT_EQ((*tokenizer)->Encode(""), reference.Encode(""));
}

TEST_P(Llama2cBpeTest, LongTextTakesLinearishTime) {
  // 256 KiB of text: run.c's scan would take minutes at this size; the heap takes well
  // under a second even in a sanitizer build.
  if (!HaveModel(GetParam())) GTEST_SKIP() << "no " << GetParam();
  std::mt19937_64 rng(1);
  std::string text;
  while (text.size() < (256u << 10)) text += RandomText(rng, 100);
  auto tokenizer = LoadTokenizer(ModelPath(GetParam()));
  ASSERT_TRUE(tokenizer.ok());
  const auto start = std::chrono::steady_clock::now();
  const auto ids = (*tokenizer)->Encode(text);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ((*tokenizer)->Decode(ids), text);
  EXPECT_LT(seconds, 5.0 * SlowdownFactor());
}

TEST(Llama2cBpeTest, AVocabularyWithInnerSpacesMergesAcrossWords) {
  // A piece with a space inside ("e t", "d, a") lets merges cross words: the tokenizer must
  // then merge the whole text at once, and still equal run.c.
  if (!HaveModel("tok512.bin")) GTEST_SKIP() << "no tok512.bin";
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  std::ifstream in(ModelPath("tok512.bin"), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (const std::string piece : {"e t", "d, a", "l a", " the b"}) {
    const float score = 100.0f;
    const int32_t len = static_cast<int32_t>(piece.size());
    bytes.append(reinterpret_cast<const char*>(&score), 4);
    bytes.append(reinterpret_cast<const char*>(&len), 4);
    bytes += piece;
  }
  const std::string path = ::testing::TempDir() + "/inner_spaces_tok.bin";
  std::ofstream(path, std::ios::binary) << bytes;
  auto tokenizer = LoadTokenizer(path);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const RunCReference reference(path);
  bool crossed = false;
  for (int round = 0; round < 60; ++round) {
    const std::string text = RandomText(rng, 1 + static_cast<int>(rng() % 40));
    const auto ids = (*tokenizer)->Encode(text);
    ASSERT_EQ(ids, reference.Encode(text)) << "text: " << text;
    for (int32_t id : ids) crossed |= id >= 512;
  }
  EXPECT_TRUE(crossed) << "no cross-word piece was used: the test would not see a wrong split";
}

INSTANTIATE_TEST_SUITE_P(TrainedVocabularies, Llama2cBpeTest, ::testing::Values("tok512.bin", "tok32000.bin"),
                         [](const auto& info) { return info.param == "tok512.bin" ? "tok512" : "tok32000"; });

}  // namespace
}  // namespace lazykv::testing
