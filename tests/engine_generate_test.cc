// Generation end to end: the trained model's known story, sampling, and bad requests.
#include <random>

#include "gtest/gtest.h"
#include "tests/engine_test_util.h"
#include "tests/test_util.h"
#include "worker/llama2c_loader.h"
#include "worker/synthetic_model.h"
#include "worker/tokenizer.h"

namespace lazykv::testing {
namespace {

TEST(StoriesModelTest, GreedyFromTheAnchorTellsTheKnownStory) {
  if (!HaveModel("stories260K.bin") || !HaveModel("tok512.bin")) GTEST_SKIP() << "no ../shared/models";
  auto weights = LoadLlama2cCheckpoint(ModelPath("stories260K.bin"));
  auto tokenizer = LoadTokenizer(ModelPath("tok512.bin"));
  ASSERT_TRUE(weights.ok() && tokenizer.ok());
  for (AttentionMode mode : {AttentionMode::kLazy, AttentionMode::kNone}) {
    auto engine = MakeEngine(*weights, mode);
    GenerateRequest request;  // no documents, no prompt: the anchor (BOS) alone
    request.sampling.max_tokens = 60;
    auto result = engine->Generate(request);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->prompt_token_ids, std::vector<int32_t>{1});
    const std::string text = DecodeContinuation(**tokenizer, result->prompt_token_ids, result->tokens);
    EXPECT_TRUE(text.starts_with("Once upon a time, there was a little girl named Lily. She loved to play outside "
                                 "in the park. One day, she saw a big, red ball."))
        << text;

    // The same tokens from the independent naive implementation, greedily, step by step.
    std::vector<int32_t> sequence = {1};
    for (size_t step = 0; step < 25; ++step) {
      const auto logits = NaiveForward(*weights, sequence).back();
      const int32_t next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      ASSERT_EQ(next, result->tokens[step]) << "step " << step;
      sequence.push_back(next);
    }
  }
}

TEST(SamplingTest, SeededSamplingIsReproducibleAndSeedsDiffer) {
  const ModelWeights weights = MakeSyntheticWeights(*SyntheticConfig("tiny"), FreshSeed());
  auto engine = MakeEngine(weights, AttentionMode::kLazy);
  GenerateRequest request;
  request.prompt = {5, 6, 7};
  request.sampling = SamplingParams{.max_tokens = 24, .temperature = 1.0f, .top_p = 0.9f, .seed = 42};
  auto a = engine->Generate(request);
  auto b = engine->Generate(request);
  request.sampling.seed = 43;
  auto c = engine->Generate(request);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->tokens, b->tokens);
  EXPECT_EQ(a->logprobs, b->logprobs);
  EXPECT_NE(a->tokens, c->tokens);
  for (float lp : a->logprobs) EXPECT_LE(lp, 0.0f);
}

TEST(SamplingTest, StopsAtEosAndReportsFinishReason) {
  ModelWeights weights = MakeSyntheticWeights(*SyntheticConfig("tiny"), FreshSeed());
  {
    auto engine = MakeEngine(weights, AttentionMode::kLazy);
    GenerateRequest request;
    request.prompt = {7, 8};
    request.sampling.max_tokens = 9;
    auto r = engine->Generate(request);
    ASSERT_TRUE(r.ok());
    if (std::find(r->tokens.begin(), r->tokens.end(), weights.config.eos_id) == r->tokens.end() &&
        r->tokens.size() == 9u) {
      EXPECT_EQ(r->finish_reason, "length");
    }
  }
  // Make EOS dominate the shared classifier: greedy decoding must stop at once.
  for (int i = 0; i < weights.config.dim; ++i) weights.embedding[weights.config.eos_id * weights.config.dim + i] *= 200;
  auto engine = MakeEngine(weights, AttentionMode::kLazy);
  GenerateRequest request;
  request.prompt = {7, 8};
  request.sampling.max_tokens = 9;
  request.record_logits = true;
  auto r = engine->Generate(request);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->step_logits.size(), 1u);
  const auto& logits = r->step_logits[0];
  ASSERT_EQ(std::max_element(logits.begin(), logits.end()) - logits.begin(), weights.config.eos_id);
  EXPECT_EQ(r->finish_reason, "stop");
  EXPECT_TRUE(r->tokens.empty());
}

TEST(BadRequestTest, ClearErrorsAndNothingLost) {
  const ModelWeights weights = MakeSyntheticWeights(*SyntheticConfig("tiny"), FreshSeed());
  auto engine = MakeEngine(weights, AttentionMode::kLazy);
  GenerateRequest good;
  good.docs = {{10, 11, 12, 13}, {20, 21, 22}};
  good.prompt = {30, 31};
  good.sampling.max_tokens = 4;
  auto before = engine->Generate(good);
  ASSERT_TRUE(before.ok());
  const size_t cached_entries = engine->stats().cached_entries;

  auto expect_invalid = [&](GenerateRequest request, const std::string& needle) {
    auto r = engine->Generate(request);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status();
  };
  GenerateRequest bad = good;
  bad.docs[1][2] = 512;
  expect_invalid(bad, "docs[1][2]");
  bad = good;
  bad.prompt[0] = -1;
  expect_invalid(bad, "prompt[0]");
  bad = good;
  bad.sampling.max_tokens = weights.config.max_seq_len;
  expect_invalid(bad, "context");
  bad = good;
  bad.sampling.temperature = -1;
  expect_invalid(bad, "temperature");
  bad = good;
  bad.sampling.top_p = 0;
  expect_invalid(bad, "top_p");

  // Nothing stored was lost and the engine still serves the same answer from cache.
  EXPECT_EQ(engine->stats().cached_entries, cached_entries);
  auto after = engine->Generate(good);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->tokens, before->tokens);
  EXPECT_EQ(after->usage.chunk_hits, 3);
  ExpectNoLeakedBlocks(*engine);
}

TEST(EmptyPromptTest, LastDocumentBecomesTheRequestsOwnTokens) {
  const ModelWeights weights = MakeSyntheticWeights(*SyntheticConfig("tiny-hf"), FreshSeed());
  auto lazy = MakeEngine(weights, AttentionMode::kLazy);
  auto block = MakeEngine(weights, AttentionMode::kBlock);
  GenerateRequest request;
  request.docs = {{10, 11, 12, 13, 14}, {20, 21, 22}};
  request.sampling.max_tokens = 5;
  request.record_logits = true;
  auto a = lazy->Generate(request);
  auto b = block->Generate(request);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->tokens, b->tokens);
  EXPECT_EQ(a->usage.chunk_misses, 2);  // the anchor and the first document; the last is computed in place
  EXPECT_EQ(a->usage.computed_tokens, a->usage.prompt_tokens);
  EXPECT_LT(RelativeError(a->step_logits[0], b->step_logits[0]), 1e-4);
}

}  // namespace
}  // namespace lazykv::testing
