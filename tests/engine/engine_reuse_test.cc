// What each mode reuses, and that reuse never changes output: lazy reuses every cached
// document wherever it lands, prefix only an unchanged prefix, none nothing; a pool
// smaller than the working set evicts and recomputes with identical results.
#include <numeric>
#include <random>

#include "gtest/gtest.h"
#include "tests/engine/engine_test_util.h"
#include "tests/test_util.h"
#include "worker/model/synthetic_model.h"

namespace lazykv::testing {
namespace {

struct Corpus {
  ModelWeights weights;
  std::vector<std::vector<int32_t>> docs;
  std::vector<int32_t> prompt_a, prompt_b;
  int doc_tokens(std::initializer_list<int> which) const {
    int n = 0;
    for (int d : which) n += static_cast<int>(docs[d].size());
    return n;
  }
};

Corpus MakeCorpus(uint64_t seed, int num_docs = 3, int min_length = 17) {
  std::mt19937_64 rng(seed);
  Corpus c{MakeSyntheticWeights(*SyntheticConfig("tiny"), seed), {}, {}, {}};
  for (int d = 0; d < num_docs; ++d) {
    c.docs.push_back(RandomTokens(rng, std::uniform_int_distribution<int>(min_length, 60)(rng), 512));
  }
  c.prompt_a = RandomTokens(rng, 5, 512);
  c.prompt_b = RandomTokens(rng, 6, 512);
  return c;
}

GenerateRequest Request(const Corpus& c, std::vector<int> order, const std::vector<int32_t>& prompt) {
  GenerateRequest r;
  for (int d : order) r.docs.push_back(c.docs[d]);
  r.prompt = prompt;
  r.sampling.max_tokens = 3;
  return r;
}

TEST(ReuseTest, LazyReusesEveryDocumentWhateverItsPosition) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const Corpus c = MakeCorpus(seed);
  for (AttentionMode mode : {AttentionMode::kLazy, AttentionMode::kBlock}) {
    auto engine = MakeEngine(c.weights, mode);
    auto first = engine->Generate(Request(c, {0, 1, 2}, c.prompt_a));
    ASSERT_TRUE(first.ok()) << first.status();
    EXPECT_EQ(first->usage.cached_tokens, 0);
    EXPECT_EQ(first->usage.chunk_misses, 4);  // the anchor and three documents
    EXPECT_EQ(first->usage.cached_documents, 0);
    EXPECT_EQ(first->usage.computed_tokens, first->usage.prompt_tokens);

    auto second = engine->Generate(Request(c, {2, 0, 1}, c.prompt_b));
    ASSERT_TRUE(second.ok()) << second.status();
    EXPECT_EQ(second->usage.chunk_hits, 4);
    EXPECT_EQ(second->usage.cached_documents, 3);
    EXPECT_EQ(second->usage.chunk_misses, 0);
    EXPECT_EQ(second->usage.cached_tokens, 1 + c.doc_tokens({0, 1, 2}));  // anchor + all documents
    EXPECT_EQ(second->usage.computed_tokens, static_cast<int>(c.prompt_b.size()));
    EXPECT_EQ(second->usage.cached_tokens + second->usage.computed_tokens, second->usage.prompt_tokens);
    if (mode == AttentionMode::kLazy) {
      EXPECT_EQ(second->usage.kv_bytes_copied, 0u);
    } else {
      EXPECT_GT(second->usage.kv_bytes_copied, 0u);
    }
    ExpectNoLeakedBlocks(*engine);
  }
}

TEST(ReuseTest, ADocumentRepeatedWithinARequestIsOneDocument) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const Corpus c = MakeCorpus(seed);
  const int a = c.doc_tokens({0}), b = c.doc_tokens({1});
  for (AttentionMode mode : {AttentionMode::kLazy, AttentionMode::kBlock, AttentionMode::kPrefix}) {
    SCOPED_TRACE(AttentionModeName(mode));
    auto engine = MakeEngine(c.weights, mode);
    auto first = engine->Generate(Request(c, {0, 1, 0}, c.prompt_a));
    ASSERT_TRUE(first.ok()) << first.status();
    const Usage& u = first->usage;
    EXPECT_EQ(u.document_tokens, a + b);     // not 2a + b
    EXPECT_EQ(u.document_cached_tokens, 0);  // nothing was cached before this request
    EXPECT_EQ(u.cached_documents, 0);
    EXPECT_EQ(u.document_computed_tokens, a + b);
    // Every position is still accounted for by where its KV came from.
    EXPECT_EQ(u.pool_tokens + u.host_tokens + u.disk_tokens + u.remote_tokens + u.computed_tokens, u.prompt_tokens);
    if (mode != AttentionMode::kPrefix) {
      EXPECT_EQ(u.chunk_misses, 3);  // the anchor, A and B; A's repeat is neither hit nor miss
      EXPECT_EQ(u.chunk_hits, 0);
      EXPECT_EQ(u.computed_tokens, u.prompt_tokens - a);  // A's second position reuses its KV
    }

    auto second = engine->Generate(Request(c, {1, 0, 0}, c.prompt_b));
    ASSERT_TRUE(second.ok()) << second.status();
    if (mode != AttentionMode::kPrefix) {
      EXPECT_EQ(second->usage.document_tokens, a + b);
      EXPECT_EQ(second->usage.document_cached_tokens, a + b);
      EXPECT_EQ(second->usage.cached_documents, 2);
      EXPECT_EQ(second->usage.chunk_hits, 3);
    }
  }
}

TEST(ReuseTest, PrefixReusesOnlyTheUnchangedPrefix) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const Corpus c = MakeCorpus(seed);
  constexpr int kBlock = 16;
  auto engine = MakeEngine(c.weights, AttentionMode::kPrefix, kBlock);
  auto first = engine->Generate(Request(c, {0, 1, 2}, c.prompt_a));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->usage.cached_tokens, 0);

  // Same documents, same order, new prompt: every full block of the shared prefix.
  auto same_order = engine->Generate(Request(c, {0, 1, 2}, c.prompt_b));
  ASSERT_TRUE(same_order.ok());
  const int shared = 1 + c.doc_tokens({0, 1, 2});
  EXPECT_EQ(same_order->usage.cached_tokens, shared / kBlock * kBlock);
  // Documents reused whole: those ending within the reused blocks.
  int whole = 0;
  for (int end = 1, d = 0; d < 3; ++d) {
    end += c.doc_tokens({d});
    whole += end <= shared / kBlock * kBlock;
  }
  EXPECT_EQ(same_order->usage.cached_documents, whole);

  // Reordered: the first block differs, so nothing is reused.
  auto reordered = engine->Generate(Request(c, {2, 0, 1}, c.prompt_b));
  ASSERT_TRUE(reordered.ok());
  EXPECT_EQ(reordered->usage.cached_tokens, 0);

  // Same first document only: its full blocks, not the rest.
  auto same_first = engine->Generate(Request(c, {0, 2, 1}, c.prompt_a));
  ASSERT_TRUE(same_first.ok());
  EXPECT_EQ(same_first->usage.cached_tokens, (1 + c.doc_tokens({0})) / kBlock * kBlock);
  EXPECT_LT(same_first->usage.cached_tokens, 1 + c.doc_tokens({0, 1, 2}));

  // Prefix reuse is exact: outputs equal the no-reuse mode's.
  auto none = MakeEngine(c.weights, AttentionMode::kNone, kBlock);
  auto reference = none->Generate(Request(c, {0, 1, 2}, c.prompt_b));
  ASSERT_TRUE(reference.ok());
  EXPECT_EQ(reference->tokens, same_order->tokens);
  EXPECT_EQ(reference->usage.cached_tokens, 0);
  ExpectNoLeakedBlocks(*engine);
}

TEST(ReuseTest, NoneReusesNothing) {
  const uint64_t seed = FreshSeed();
  const Corpus c = MakeCorpus(seed);
  auto engine = MakeEngine(c.weights, AttentionMode::kNone);
  for (int i = 0; i < 2; ++i) {
    auto result = engine->Generate(Request(c, {0, 1, 2}, c.prompt_a));
    ASSERT_TRUE(result.ok());
    EXPECT_EQ(result->usage.cached_tokens, 0);
    EXPECT_EQ(result->usage.computed_tokens, result->usage.prompt_tokens);
  }
  EXPECT_EQ(engine->stats().cached_entries, 0u);
}

TEST(ReuseTest, ModeOverridePerRequestSharesOneCache) {
  const Corpus c = MakeCorpus(FreshSeed());
  auto engine = MakeEngine(c.weights, AttentionMode::kLazy);
  GenerateRequest request = Request(c, {0, 1}, c.prompt_a);
  request.mode = AttentionMode::kBlock;
  auto block = engine->Generate(request);
  ASSERT_TRUE(block.ok());
  EXPECT_EQ(block->mode, AttentionMode::kBlock);
  request.mode.reset();
  auto lazy = engine->Generate(request);
  ASSERT_TRUE(lazy.ok());
  EXPECT_EQ(lazy->mode, AttentionMode::kLazy);
  EXPECT_EQ(lazy->usage.chunk_hits, 3);  // chunks encoded under `block` serve `lazy`
  EXPECT_EQ(lazy->tokens, block->tokens);
}

TEST(PoolPressureTest, SmallPoolChangesNoOutputOnlyReuse) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  const Corpus c = MakeCorpus(seed, /*num_docs=*/8, /*min_length=*/40);
  for (AttentionMode mode : {AttentionMode::kLazy, AttentionMode::kBlock, AttentionMode::kPrefix}) {
    SCOPED_TRACE(AttentionModeName(mode));
    auto roomy = MakeEngine(c.weights, mode, 8, 4096);
    // Enough for one request (3 documents of 40 to 60 tokens, the block baseline's
    // copies included), less than the 8-document working set of 40 to 64 blocks.
    auto tight = MakeEngine(c.weights, mode, 8, mode == AttentionMode::kBlock ? 60 : 36);
    int tight_hits = 0, roomy_hits = 0;
    // 24 requests: with fewer, some seeds evict only documents never asked for again.
    for (int r = 0; r < 24; ++r) {
      std::vector<int> order(8);
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng);
      order.resize(3);
      GenerateRequest request = Request(c, order, c.prompt_a);
      request.record_logits = true;
      auto a = roomy->Generate(request);
      auto b = tight->Generate(request);
      ASSERT_TRUE(a.ok()) << a.status();
      ASSERT_TRUE(b.ok()) << b.status();
      EXPECT_EQ(a->tokens, b->tokens);
      for (size_t s = 0; s < a->step_logits.size(); ++s) {
        EXPECT_LT(RelativeError(b->step_logits[s], a->step_logits[s]), 1e-6);
      }
      tight_hits += b->usage.cached_tokens;
      roomy_hits += a->usage.cached_tokens;
      ExpectNoLeakedBlocks(*tight);
    }
    EXPECT_GT(tight->stats().evictions, 0u);
    EXPECT_EQ(roomy->stats().evictions, 0u);
    EXPECT_LT(tight_hits, roomy_hits);
  }
}

TEST(PoolPressureTest, RequestLargerThanThePoolIsRejectedUpFront) {
  const Corpus c = MakeCorpus(FreshSeed());
  auto engine = MakeEngine(c.weights, AttentionMode::kLazy, 4, 8);
  auto result = engine->Generate(Request(c, {0, 1, 2}, c.prompt_a));
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(result.status().message().find("KV blocks"), std::string::npos) << result.status();
  ExpectNoLeakedBlocks(*engine);
}

}  // namespace
}  // namespace lazykv::testing
