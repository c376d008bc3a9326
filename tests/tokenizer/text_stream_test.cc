// TextStream, the streamed text every front end shows, against the reference streaming
// decoder of the Llama 3 test data (stream_vectors.jsonl, made by make_vectors.js's
// streamDecode: what is released after each token, and at the end), then stop strings
// against a plain search of the whole reply, with fresh random replies.
#include "worker/tokenizer/text_stream.h"

#include <random>

#include "common/utf8.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace lazykv::testing {
namespace {

using json = nlohmann::json;

class TextStreamLlama3Test : public ::testing::Test {
 protected:
  void SetUp() override {
    tokenizer_ = Llama3Tokenizer();
    if (tokenizer_ == nullptr) GTEST_SKIP() << "no ../shared/tokenizers/llama3";
  }
  const Tokenizer* tokenizer_ = nullptr;
};

// Every sequence and malformed stream: the same text released after each token, held
// bytes flushed the same way at the end (U+FFFD for a character cut short, once).
TEST_F(TextStreamLlama3Test, ReleasesWhatTheReferenceReleases) {
  int checked = 0;
  for (const json& s : ReadJsonLines(Llama3TokenizerDir() + "/stream_vectors.jsonl")) {
    if (s["kind"] == "single_token") continue;
    SCOPED_TRACE(s["name"].get<std::string>());
    TextStream stream(*tokenizer_, {}, {});
    const auto ids = s["ids"].get<std::vector<int32_t>>();
    ASSERT_EQ(ids.size(), s["stream_emits"].size());
    std::string joined;
    for (size_t i = 0; i < ids.size(); ++i) {
      const std::string piece = stream.Add(ids[i]);
      EXPECT_EQ(piece, s["stream_emits"][i].get<std::string>()) << "after token " << i;
      joined += piece;
    }
    const std::string flushed = stream.Flush();
    EXPECT_EQ(flushed, s["flush"].get<std::string>());
    EXPECT_EQ(joined + flushed, s["joined"].get<std::string>());
    ++checked;
  }
  EXPECT_EQ(checked, 15);
}

// Random replies of real tokens (many of them partial characters) with random stop
// strings cut from the reply itself: the streamed text is the reply's lossy decoding up to
// the first stop string to appear, whatever the token boundaries, and no delta splits a
// character.
TEST_F(TextStreamLlama3Test, StopsWhereAPlainSearchOfTheWholeTextStops) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(seed);
  std::mt19937_64 rng(seed);
  const auto partial = ReadJsonLines(Llama3TokenizerDir() + "/stream_vectors.jsonl");
  std::vector<int32_t> pool;
  for (const json& s : partial) {
    if (s["kind"] == "single_token") pool.push_back(s["id"].get<int32_t>());
  }
  for (int32_t id : tokenizer_->Encode("The llama 🦙 ate café crème, 你好 and hello world again."))
    pool.push_back(id);
  int stopped = 0;
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<int32_t> reply(1 + rng() % 40);
    for (int32_t& id : reply) id = pool[rng() % pool.size()];
    const std::string raw = tokenizer_->Decode(reply);
    std::vector<std::string> stops;
    for (int k = rng() % 3; k > 0; --k) {
      const size_t at = rng() % raw.size(), length = 1 + rng() % 4;
      stops.push_back(raw.substr(at, length));
    }
    if (rng() % 4 == 0) stops.push_back("never in this text \x01");
    // The reply ends after the first token whose text completes a stop string, before
    // the earliest stop string in the text so far (a longer one that starts earlier but
    // would end later has not appeared yet: streaming cannot wait for it).
    size_t cut = raw.size();
    for (size_t n = 1; n <= reply.size() && cut == raw.size(); ++n) {
      const std::string so_far = tokenizer_->Decode(std::span(reply).first(n));
      for (const std::string& stop : stops) cut = std::min(cut, so_far.find(stop));
    }
    TextStream stream(*tokenizer_, {}, stops);
    std::string shown;
    for (int32_t id : reply) {
      const std::string piece = stream.Add(id);
      ASSERT_EQ(SanitizeUtf8(piece), piece) << "a delta that is not valid UTF-8";
      shown += piece;
    }
    shown += stream.Flush();
    stopped += stream.stopped();
    EXPECT_EQ(stream.stopped(), cut < raw.size());
    // Lossy decoding of the bytes before the stop (a stop inside a character cuts it).
    EXPECT_EQ(shown, SanitizeUtf8(std::string_view(raw).substr(0, cut))) << ::testing::PrintToString(stops);
  }
  EXPECT_GT(stopped, 50);
}

}  // namespace
}  // namespace lazykv::testing
