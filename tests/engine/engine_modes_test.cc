// The four attention modes against independent references: `none` against a naive
// dense implementation, `lazy` against `block` (the same function computed by a
// materialized copy), on random models of each RoPE variant and on a trained model.
#include <algorithm>
#include <random>

#include "gtest/gtest.h"
#include "tests/engine/engine_compare_util.h"
#include "tests/engine/engine_test_util.h"
#include "tests/test_util.h"
#include "worker/model/llama2c_loader.h"
#include "worker/model/synthetic_model.h"
#include "worker/tokenizer/tokenizer.h"

namespace lazykv::testing {
namespace {

constexpr double kTolerance = 1e-4;

class RopeVariantTest : public ::testing::TestWithParam<std::string> {};

TEST_P(RopeVariantTest, NoneModeMatchesNaiveDenseAttention) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  const ModelWeights weights = RandomModel(GetParam(), seed);
  // A small prefill piece so that chunked prefill (queries continuing a sequence) runs too.
  auto engine = MakeEngine(weights, AttentionMode::kNone, /*block_size=*/std::uniform_int_distribution<int>(3, 16)(rng),
                           2048, /*max_prefill_tokens=*/std::uniform_int_distribution<int>(5, 40)(rng));
  GenerateRequest request;
  for (int d = 0; d < 3; ++d) {
    request.docs.push_back(RandomTokens(rng, std::uniform_int_distribution<int>(1, 30)(rng), 512));
  }
  request.prompt = RandomTokens(rng, 7, 512);
  request.sampling.max_tokens = 5;
  request.record_logits = true;
  auto result = engine->Generate(request);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->step_logits.size(), result->tokens.size() + (result->finish_reason == "stop" ? 1 : 0));

  std::vector<int32_t> sequence = result->prompt_token_ids;
  sequence.insert(sequence.end(), result->tokens.begin(), result->tokens.end());
  const auto reference = NaiveForward(weights, sequence);
  for (size_t step = 0; step < result->step_logits.size(); ++step) {
    const size_t position = result->prompt_token_ids.size() - 1 + step;
    EXPECT_LT(RelativeError(result->step_logits[step], reference[position]), kTolerance) << "step " << step;
  }
  ExpectNoLeakedBlocks(*engine);
}

// Random documents in random orders through lazy and block engines; returns nothing,
// asserts equality of every step's logits and every greedy token.
void ExpectLazyEqualsBlock(const ModelWeights& weights, const std::vector<std::vector<int32_t>>& corpus,
                           std::mt19937_64& rng, int requests, int block_size) {
  auto lazy = MakeEngine(weights, AttentionMode::kLazy, block_size);
  auto block = MakeEngine(weights, AttentionMode::kBlock, block_size);
  auto none = MakeEngine(weights, AttentionMode::kNone, block_size);
  bool differs_from_none = false;
  for (int r = 0; r < requests; ++r) {
    GenerateRequest request;
    std::vector<size_t> order(corpus.size());
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    const size_t k = std::uniform_int_distribution<size_t>(2, corpus.size())(rng);
    for (size_t i = 0; i < k; ++i) request.docs.push_back(corpus[order[i]]);
    request.prompt = RandomTokens(rng, std::uniform_int_distribution<int>(1, 9)(rng), weights.config.vocab_size);
    request.sampling.max_tokens = 6;
    request.record_logits = true;
    auto a = lazy->Generate(request);
    auto b = block->Generate(request);
    auto n = none->Generate(request);
    ASSERT_TRUE(a.ok() && b.ok() && n.ok()) << a.status() << b.status() << n.status();
    ASSERT_EQ(a->tokens, b->tokens) << "request " << r;
    ASSERT_EQ(a->step_logits.size(), b->step_logits.size());
    for (size_t s = 0; s < a->step_logits.size(); ++s) {
      EXPECT_LT(RelativeError(a->step_logits[s], b->step_logits[s]), kTolerance) << "request " << r << " step " << s;
    }
    // Documents do not see each other in lazy/block, so `none` must differ somewhere.
    differs_from_none |= RelativeError(a->step_logits[0], n->step_logits[0]) > 1e-3;
    EXPECT_EQ(a->usage.kv_bytes_copied, 0u);
    EXPECT_GT(b->usage.kv_bytes_copied, 0u);  // the second document always moves
  }
  EXPECT_TRUE(differs_from_none) << "lazy equals none: the comparison would not detect a wrong mask";
  ExpectNoLeakedBlocks(*lazy);
  ExpectNoLeakedBlocks(*block);
}

TEST_P(RopeVariantTest, LazyMatchesBlockForRandomDocumentsInRandomOrders) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  const ModelWeights weights = RandomModel(GetParam(), seed);
  std::vector<std::vector<int32_t>> corpus;
  for (int d = 0; d < 5; ++d) {
    corpus.push_back(RandomTokens(rng, std::uniform_int_distribution<int>(1, 40)(rng), weights.config.vocab_size));
  }
  ExpectLazyEqualsBlock(weights, corpus, rng, /*requests=*/4,
                        /*block_size=*/std::uniform_int_distribution<int>(4, 16)(rng));
}

INSTANTIATE_TEST_SUITE_P(AllRopeVariants, RopeVariantTest, ::testing::Values("tiny", "tiny-hf", "tiny-llama3"));

TEST(LazyModeTest, LargeDeltasStayExact) {
  // Documents placed far from where they were encoded: deltas in the thousands.
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  const ModelWeights weights = RandomModel("tiny-llama3", seed);
  std::vector<std::vector<int32_t>> corpus;
  for (int d = 0; d < 3; ++d) corpus.push_back(RandomTokens(rng, 700 + d * 13, weights.config.vocab_size));
  ExpectLazyEqualsBlock(weights, corpus, rng, /*requests=*/2, /*block_size=*/16);
}

TEST(LazyModeTest, MatchesBlockOnTrainedStoriesModel) {
  if (!HaveModel("stories260K.bin") || !HaveModel("tok512.bin")) GTEST_SKIP() << "no ../shared/models";
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  auto weights = LoadLlama2cCheckpoint(ModelPath("stories260K.bin"));
  auto tokenizer = LoadTokenizer(ModelPath("tok512.bin"));
  ASSERT_TRUE(weights.ok() && tokenizer.ok());
  std::vector<std::vector<int32_t>> corpus;
  for (const auto& text : StoryTexts()) corpus.push_back((*tokenizer)->Encode(text));
  ExpectLazyEqualsBlock(*weights, corpus, rng, /*requests=*/5, /*block_size=*/16);
}

}  // namespace
}  // namespace lazykv::testing
