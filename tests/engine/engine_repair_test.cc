// The repair (GenerateRequest::repair_tokens) against an independent statement of what it
// computes: PlacedDocumentsReference (tests/engine/placed_documents_reference.h) with the
// repaired rows written out.
// Bugs this catches: repaired KV written into the shared chunk (the next request sees
// it), the rest of the chunk's block copied from the wrong slot or without its rotation,
// repaired tokens run before the documents before them are attached, the first document
// repaired (harmless) or a later one not repaired (visible).
#include <algorithm>
#include <map>
#include <random>

#include "gtest/gtest.h"
#include "tests/engine/engine_test_util.h"
#include "tests/engine/placed_documents_reference.h"
#include "tests/test_util.h"

namespace lazykv::testing {
namespace {

constexpr double kTolerance = 1e-4;

void ExpectMatchesReference(const ModelWeights& weights, const std::vector<int32_t>& anchor, const GenerateRequest& request,
                            const GenerateResult& result, const std::string& what) {
  const auto reference =
      PlacedDocumentsReference(weights, anchor, request.docs, request.prompt, result.tokens, request.repair_tokens);
  ASSERT_EQ(result.step_logits.size(), result.tokens.size() + (result.finish_reason == "stop" ? 1 : 0)) << what;
  for (size_t s = 0; s < result.step_logits.size(); ++s) {
    EXPECT_LT(RelativeError(result.step_logits[s], reference[s]), kTolerance) << what << ", step " << s;
  }
}

int ExpectedRepairedTokens(const GenerateRequest& request) {
  int total = 0;
  bool first = true;
  for (const auto& doc : request.docs) {
    if (doc.empty()) continue;
    if (!first) total += std::min(request.repair_tokens, static_cast<int>(doc.size()));
    first = false;
  }
  return total;
}

GenerateRequest RandomRequest(std::mt19937_64& rng, int vocab, int repair) {
  GenerateRequest request = RandomPlacedRequest(rng, vocab);
  request.repair_tokens = repair;
  return request;
}

class RepairReferenceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(RepairReferenceTest, LazyAndBlockWithRepairEqualDenseAttentionWithRepairedHeads) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  const ModelWeights weights = RandomModel(GetParam(), seed);
  const int vocab = weights.config.vocab_size;
  for (int round = 0; round < 3; ++round) {
    const std::vector<int32_t> anchor =
        round == 0 ? std::vector<int32_t>{weights.config.bos_id} : RandomTokens(rng, 3, vocab);
    // A repair shorter than a block, across block ends, and longer than some documents.
    const int repair = std::uniform_int_distribution<int>(1, 40)(rng);
    const int block_size = std::uniform_int_distribution<int>(3, 16)(rng);
    const GenerateRequest request = RandomRequest(rng, vocab, repair);
    SCOPED_TRACE(::testing::Message() << "repair " << repair << ", block size " << block_size);
    for (AttentionMode mode : {AttentionMode::kLazy, AttentionMode::kBlock}) {
      auto engine = MakeEngineWithAnchor(weights, mode, block_size, anchor);
      auto result = engine->Generate(request);
      ASSERT_TRUE(result.ok()) << result.status();
      ExpectMatchesReference(weights, anchor, request, *result, std::string(AttentionModeName(mode)));
      EXPECT_EQ(result->usage.repaired_tokens, ExpectedRepairedTokens(request));
      ExpectNoLeakedBlocks(*engine);

      // The same documents unrepaired on the same engine reuse the chunks the repaired
      // request used: they must be intact (the reference with repair 0).
      GenerateRequest plain = request;
      plain.repair_tokens = 0;
      auto after = engine->Generate(plain);
      ASSERT_TRUE(after.ok()) << after.status();
      EXPECT_EQ(after->usage.repaired_tokens, 0);
      EXPECT_EQ(after->usage.computed_tokens, static_cast<int>(request.prompt.size()));
      ExpectMatchesReference(weights, anchor, plain, *after, std::string(AttentionModeName(mode)) + " after repair");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllRopeVariants, RepairReferenceTest, ::testing::Values("tiny", "tiny-hf", "tiny-llama3"));

// Independent of the reference above: when the repair covers every document, every token
// is computed in context, which is what `none` computes.
TEST(EngineRepairTest, RepairingWholeDocumentsEqualsFullAttention) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  const ModelWeights weights = RandomModel("tiny", seed);
  GenerateRequest request = RandomRequest(rng, weights.config.vocab_size, 30);
  auto none = MakeEngine(weights, AttentionMode::kNone)->Generate(request);
  ASSERT_TRUE(none.ok()) << none.status();
  for (AttentionMode mode : {AttentionMode::kLazy, AttentionMode::kBlock}) {
    auto repaired = MakeEngine(weights, mode, 4)->Generate(request);
    ASSERT_TRUE(repaired.ok()) << repaired.status();
    EXPECT_EQ(repaired->tokens, none->tokens) << AttentionModeName(mode);
    for (size_t s = 0; s < none->step_logits.size(); ++s) {
      EXPECT_LT(RelativeError(repaired->step_logits[s], none->step_logits[s]), kTolerance)
          << AttentionModeName(mode) << " step " << s;
    }
    // Without the repair they differ: the test can tell.
    request.repair_tokens = 0;
    auto plain = MakeEngine(weights, mode, 4)->Generate(request);
    request.repair_tokens = 30;
    ASSERT_TRUE(plain.ok()) << plain.status();
    EXPECT_GT(RelativeError(plain->step_logits[0], none->step_logits[0]), 10 * kTolerance);
  }
}

// Many requests at once, each with its own repair, prefill cut into 3-token pieces (a
// repaired head then spans steps): each equals the same request run alone, the blocks
// held never exceed the reservation, and nothing leaks.
TEST(EngineRepairTest, BatchedRepairsWithChunkedPrefillEqualEachRunAlone) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  const ModelWeights weights = RandomModel("tiny-llama3", seed);
  const int vocab = weights.config.vocab_size;
  // Shared documents, so requests reuse each other's chunks.
  std::vector<std::vector<int32_t>> corpus;
  for (int i = 0; i < 5; ++i) corpus.push_back(RandomTokens(rng, std::uniform_int_distribution<int>(2, 20)(rng), vocab));
  std::vector<GenerateRequest> requests;
  for (int i = 0; i < 8; ++i) {
    GenerateRequest request;
    const int docs = std::uniform_int_distribution<int>(1, 4)(rng);
    for (int d = 0; d < docs; ++d) request.docs.push_back(corpus[rng() % corpus.size()]);
    request.prompt = RandomTokens(rng, std::uniform_int_distribution<int>(1, 6)(rng), vocab);
    request.sampling.max_tokens = 3;
    request.repair_tokens = std::uniform_int_distribution<int>(0, 9)(rng);
    request.mode = i % 2 == 0 ? AttentionMode::kLazy : AttentionMode::kBlock;
    requests.push_back(request);
  }
  auto engine = MakeEngine(weights, AttentionMode::kLazy, 4, 2048, /*max_prefill_tokens=*/3);
  std::vector<RequestId> ids;
  for (const GenerateRequest& request : requests) {
    auto id = engine->Submit(request);
    ASSERT_TRUE(id.ok()) << id.status();
    ids.push_back(*id);
  }
  std::map<RequestId, GenerateResult> results;
  std::vector<EngineEvent> events;
  for (int step = 0; step < 10000 && results.size() < requests.size(); ++step) {
    events.clear();
    engine->Step(&events);
    EXPECT_LE(engine->CountHeldBlocks(), engine->stats().reserved_blocks) << "step " << step;
    for (const EngineEvent& event : events) {
      ASSERT_NE(event.kind, EngineEvent::Kind::kFailed) << event.status;
      if (event.kind == EngineEvent::Kind::kFinished) results[event.id] = *event.result;
    }
  }
  ASSERT_EQ(results.size(), requests.size());
  ExpectNoLeakedBlocks(*engine);
  for (size_t i = 0; i < requests.size(); ++i) {
    auto alone = MakeEngine(weights, AttentionMode::kLazy, 4)->Generate(requests[i]);
    ASSERT_TRUE(alone.ok()) << alone.status();
    EXPECT_EQ(results[ids[i]].tokens, alone->tokens) << "request " << i;
    EXPECT_EQ(results[ids[i]].usage.repaired_tokens, ExpectedRepairedTokens(requests[i])) << "request " << i;
  }
}

TEST(EngineRepairTest, ReservationCoversTheRepairedBlocksExactly) {
  // On a fresh engine the reservation is the peak of blocks in use (the anchor, the
  // chunks, the repaired heads' own blocks and the prompt), in lazy mode; block mode's
  // repaired heads replace blocks of its copies.
  const ModelWeights weights = RandomModel("tiny", 7);
  std::mt19937_64 rng(7);
  GenerateRequest request;
  for (int len : {9, 13, 4, 20}) request.docs.push_back(RandomTokens(rng, len, weights.config.vocab_size));
  request.prompt = RandomTokens(rng, 5, weights.config.vocab_size);
  request.sampling.max_tokens = 6;
  for (int repair : {0, 3, 4, 6, 13}) {
    request.repair_tokens = repair;
    for (AttentionMode mode : {AttentionMode::kLazy, AttentionMode::kBlock}) {
      auto engine = MakeEngine(weights, mode, 4);
      const int reserved = engine->ReservedBlocks(request);
      auto result = engine->Generate(request);
      ASSERT_TRUE(result.ok()) << result.status();
      EXPECT_GE(reserved, engine->stats().peak_used_blocks) << AttentionModeName(mode) << " repair " << repair;
      if (mode == AttentionMode::kLazy) {
        EXPECT_EQ(reserved, engine->stats().peak_used_blocks) << "repair " << repair;
      }
    }
  }
}

TEST(EngineRepairTest, RejectsANegativeRepairAndIgnoresItWithoutChunks) {
  const ModelWeights weights = RandomModel("tiny", 3);
  std::mt19937_64 rng(3);
  GenerateRequest request = RandomRequest(rng, weights.config.vocab_size, -1);
  auto engine = MakeEngine(weights, AttentionMode::kLazy);
  auto refused = engine->Submit(request);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(refused.status().message()).find("repair_tokens"), std::string::npos) << refused.status();

  request.repair_tokens = 8;
  for (AttentionMode mode : {AttentionMode::kNone, AttentionMode::kPrefix}) {
    auto with = MakeEngine(weights, mode)->Generate(request);
    request.repair_tokens = 0;
    auto without = MakeEngine(weights, mode)->Generate(request);
    request.repair_tokens = 8;
    ASSERT_TRUE(with.ok() && without.ok());
    EXPECT_EQ(with->tokens, without->tokens);
    EXPECT_EQ(with->step_logits, without->step_logits);
    EXPECT_EQ(with->usage.repaired_tokens, 0);
  }
}

}  // namespace
}  // namespace lazykv::testing
