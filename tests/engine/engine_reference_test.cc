// Lazy and block against an independent statement of what they compute, not against each
// other (both take their rotation deltas from the same engine code, so comparing them
// cannot tell a misplaced document): PlacedDocumentsReference
// (tests/engine/placed_documents_reference.h), the naive dense forward pass over an
// explicit layout with explicit positions and mask.
// A delta that shifts documents, a chunk encoded without its anchor, a mask that lets
// documents see each other, or wrong RoPE frequencies all move the logits.
#include <algorithm>
#include <map>
#include <numeric>
#include <random>
#include <string_view>

#include "gtest/gtest.h"
#include "tests/engine/engine_compare_util.h"
#include "tests/engine/engine_test_util.h"
#include "tests/engine/placed_documents_reference.h"
#include "tests/test_util.h"
#include "worker/backend/cpu_backend.h"
#include "worker/model/llama2c_loader.h"
#include "worker/model/synthetic_model.h"
#include "worker/tokenizer/tokenizer.h"

namespace lazykv::testing {
namespace {

constexpr double kTolerance = 1e-4;

// Runs `request` through lazy and block engines and checks every step's logits against
// the reference; returns the largest relative error seen.
double ExpectModesMatchReference(const ModelWeights& weights, const std::vector<int32_t>& anchor, int block_size,
                                 const GenerateRequest& request) {
  double worst = 0;
  for (AttentionMode mode : {AttentionMode::kLazy, AttentionMode::kBlock}) {
    auto engine = MakeEngineWithAnchor(weights, mode, block_size, anchor);
    auto result = engine->Generate(request);
    EXPECT_TRUE(result.ok()) << result.status();
    if (!result.ok()) return INFINITY;
    const auto reference = PlacedDocumentsReference(weights, anchor, request.docs, request.prompt, result->tokens);
    EXPECT_EQ(result->step_logits.size(), result->tokens.size() + (result->finish_reason == "stop" ? 1 : 0));
    for (size_t s = 0; s < result->step_logits.size(); ++s) {
      const double error = RelativeError(result->step_logits[s], reference[s]);
      worst = std::max(worst, error);
      EXPECT_LT(error, kTolerance) << AttentionModeName(mode) << " step " << s;
    }
  }
  return worst;
}

class PlacedReferenceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(PlacedReferenceTest, LazyAndBlockEqualDenseAttentionWithDocumentsPlacedRight) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  const ModelWeights weights = RandomModel(GetParam(), seed);
  const int vocab = weights.config.vocab_size;
  for (int round = 0; round < 2; ++round) {
    // A one-token anchor (BOS, the default) and a longer one: a shift by the anchor's
    // length is then several positions.
    const std::vector<int32_t> anchor =
        round == 0 ? std::vector<int32_t>{weights.config.bos_id} : RandomTokens(rng, 3, vocab);
    const GenerateRequest request = RandomPlacedRequest(rng, vocab);
    ExpectModesMatchReference(weights, anchor, std::uniform_int_distribution<int>(3, 16)(rng), request);

    // The reference is not plain causal attention: `none` (documents see each other) differs.
    auto none = MakeEngineWithAnchor(weights, AttentionMode::kNone, 16, anchor);
    auto result = none->Generate(request);
    ASSERT_TRUE(result.ok()) << result.status();
    const auto reference = PlacedDocumentsReference(weights, anchor, request.docs, request.prompt, {});
    EXPECT_GT(RelativeError(result->step_logits[0], reference[0]), 10 * kTolerance)
        << "the reference equals causal attention: it could not tell a wrong mask";
  }
}

INSTANTIATE_TEST_SUITE_P(AllRopeVariants, PlacedReferenceTest, ::testing::Values("tiny", "tiny-hf", "tiny-llama3"));

TEST(PlacedReferenceTest, EmptyPromptAndEmptyDocumentsArePlacedToo) {
  // With an empty prompt the last document is the request's own tokens (full attention
  // over everything before it); empty documents take no positions.
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  const ModelWeights weights = RandomModel("tiny-llama3", seed);
  const int vocab = weights.config.vocab_size;
  GenerateRequest request;
  request.docs = {RandomTokens(rng, 11, vocab), {}, RandomTokens(rng, 17, vocab), RandomTokens(rng, 5, vocab)};
  request.sampling.max_tokens = 3;
  request.record_logits = true;
  // The reference's "prompt" is then the last document, and the shared documents the rest.
  auto shared = request.docs;
  const std::vector<int32_t> own = shared.back();
  shared.pop_back();
  for (AttentionMode mode : {AttentionMode::kLazy, AttentionMode::kBlock}) {
    auto engine = MakeEngineWithAnchor(weights, mode, 8, {weights.config.bos_id});
    auto result = engine->Generate(request);
    ASSERT_TRUE(result.ok()) << result.status();
    const auto reference = PlacedDocumentsReference(weights, {weights.config.bos_id}, shared, own, result->tokens);
    for (size_t s = 0; s < result->step_logits.size(); ++s) {
      EXPECT_LT(RelativeError(result->step_logits[s], reference[s]), kTolerance)
          << AttentionModeName(mode) << " step " << s;
    }
  }
}

TEST(PlacedReferenceTest, TrainedModelsMatchTheReference) {
  if (!HaveModel("tok512.bin")) GTEST_SKIP() << "no ../shared/models";
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  auto tokenizer = LoadTokenizer(ModelPath("tok512.bin"));
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  std::vector<std::vector<int32_t>> corpus;
  for (const auto& text : StoryTexts()) corpus.push_back((*tokenizer)->Encode(text));
  for (const char* file : {"stories260K.bin", "tinystories-gqa-d64-h192-l5.bin"}) {
    if (!HaveModel(file)) GTEST_SKIP() << "no " << file;
    SCOPED_TRACE(file);
    auto weights = LoadLlama2cCheckpoint(ModelPath(file));
    ASSERT_TRUE(weights.ok()) << weights.status();
    GenerateRequest request;
    std::vector<size_t> order(corpus.size());
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    for (size_t i = 0; i < 3; ++i) request.docs.push_back(corpus[order[i]]);
    request.prompt = (*tokenizer)->Encode("Who found the key?");
    request.sampling.max_tokens = 6;
    request.record_logits = true;
    ExpectModesMatchReference(*weights, {weights->config.bos_id}, 16, request);
  }
}

TEST(PlacedReferenceTest, WithOneDocumentLazyAndBlockEqualNone) {
  // One document right after the anchor is placed exactly where it was encoded: all three
  // modes compute the same function (block copies nothing).
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  for (const char* shape : {"tiny", "tiny-hf", "tiny-llama3"}) {
    SCOPED_TRACE(shape);
    const ModelWeights weights = RandomModel(shape, seed);
    GenerateRequest request;
    request.docs = {RandomTokens(rng, std::uniform_int_distribution<int>(1, 40)(rng), weights.config.vocab_size)};
    request.prompt = RandomTokens(rng, 6, weights.config.vocab_size);
    request.sampling.max_tokens = 5;
    request.record_logits = true;
    std::vector<GenerateResult> results;
    for (AttentionMode mode : {AttentionMode::kNone, AttentionMode::kLazy, AttentionMode::kBlock}) {
      auto engine = MakeEngineWithAnchor(weights, mode, 16, {weights.config.bos_id});
      auto result = engine->Generate(request);
      ASSERT_TRUE(result.ok()) << result.status();
      results.push_back(*std::move(result));
    }
    for (size_t m = 1; m < results.size(); ++m) {
      EXPECT_EQ(results[m].tokens, results[0].tokens);
      EXPECT_EQ(results[m].usage.kv_bytes_copied, 0u);
      ASSERT_EQ(results[m].step_logits.size(), results[0].step_logits.size());
      for (size_t s = 0; s < results[0].step_logits.size(); ++s) {
        EXPECT_LT(RelativeError(results[m].step_logits[s], results[0].step_logits[s]), 1e-6)
            << AttentionModeName(results[m].mode) << " step " << s;
      }
    }
  }
}

// --- No anchor at all (EngineOptions::anchorless) ---------------------------------------
// Each document is encoded alone from position 0, the sequence is [docs][prompt] with no
// BOS: lazy and block equal PlacedDocumentsReference with an empty anchor (documents
// block-diagonal at their logical positions, the prompt seeing everything), none and
// prefix equal plain causal attention over [docs][prompt][generated] from position 0.

std::unique_ptr<Engine> MakeAnchorlessEngine(const ModelWeights& weights, AttentionMode mode, int block_size,
                                             int max_prefill_tokens = 512) {
  EngineOptions options;
  options.mode = mode;
  options.anchorless = true;
  options.max_prefill_tokens = max_prefill_tokens;
  return MakeEngine(weights, std::move(options), block_size);
}

// Causal attention over `tokens` at positions 0..n-1, with the logits at each tail
// position from `first_wanted` on.
std::vector<std::vector<float>> CausalReference(const ModelWeights& w, const std::vector<int32_t>& tokens,
                                                size_t first_wanted) {
  std::vector<int64_t> positions(tokens.size());
  std::iota(positions.begin(), positions.end(), 0);
  std::vector<bool> want(tokens.size(), false);
  for (size_t i = first_wanted; i < tokens.size(); ++i) want[i] = true;
  auto logits = NaiveForwardMasked(
      w, tokens, positions, [](size_t q, size_t k) { return k <= q; }, want);
  return std::vector<std::vector<float>>(logits.begin() + first_wanted, logits.end());
}

std::vector<int32_t> Concatenated(const std::vector<std::vector<int32_t>>& docs, const std::vector<int32_t>& prompt) {
  std::vector<int32_t> all;
  for (const auto& doc : docs) all.insert(all.end(), doc.begin(), doc.end());
  all.insert(all.end(), prompt.begin(), prompt.end());
  return all;
}

// Every step's logits of `result` against `reference` (entry s: step s); the worst error.
double ExpectStepsMatch(const GenerateResult& result, const std::vector<std::vector<float>>& reference,
                        std::string_view what) {
  EXPECT_EQ(result.step_logits.size(), result.tokens.size() + (result.finish_reason == "stop" ? 1 : 0)) << what;
  EXPECT_LE(result.step_logits.size(), reference.size()) << what;
  double worst = 0;
  for (size_t s = 0; s < std::min(result.step_logits.size(), reference.size()); ++s) {
    const double error = RelativeError(result.step_logits[s], reference[s]);
    worst = std::max(worst, error);
    EXPECT_LT(error, kTolerance) << what << " step " << s;
  }
  return worst;
}

class AnchorlessReferenceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(AnchorlessReferenceTest, EveryModeEqualsItsReferenceWithNoAnchor) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  const ModelWeights weights = RandomModel(GetParam(), seed);
  const int vocab = weights.config.vocab_size;
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(::testing::Message() << "round " << round);
    const GenerateRequest request = RandomPlacedRequest(rng, vocab);
    const int docs = static_cast<int>(request.docs.size());
    const int bs = std::uniform_int_distribution<int>(3, 16)(rng);
    const int piece = std::uniform_int_distribution<int>(5, 40)(rng);  // chunked prefill too
    const std::vector<int32_t> all = Concatenated(request.docs, request.prompt);

    std::map<AttentionMode, GenerateResult> results;
    for (AttentionMode mode :
         {AttentionMode::kNone, AttentionMode::kPrefix, AttentionMode::kLazy, AttentionMode::kBlock}) {
      SCOPED_TRACE(AttentionModeName(mode));
      auto engine = MakeAnchorlessEngine(weights, mode, bs, piece);
      EXPECT_TRUE(engine->anchor().empty());
      auto result = engine->Generate(request);
      ASSERT_TRUE(result.ok()) << result.status();
      EXPECT_EQ(result->prompt_token_ids, all) << "no BOS, no anchor before the documents";
      EXPECT_EQ(result->usage.prompt_tokens, static_cast<int>(all.size()));
      EXPECT_EQ(result->usage.computed_tokens, static_cast<int>(all.size()));
      EXPECT_EQ(result->usage.chunk_misses, mode == AttentionMode::kLazy || mode == AttentionMode::kBlock ? docs : 0)
          << "the documents only: there is no anchor chunk";
      EXPECT_EQ(result->usage.chunk_hits, 0);
      if (mode == AttentionMode::kLazy) {
        EXPECT_EQ(engine->stats().cached_entries, static_cast<size_t>(docs)) << "no anchor chunk cached";
      }
      ExpectNoLeakedBlocks(*engine);
      std::vector<std::vector<float>> reference;
      if (mode == AttentionMode::kNone || mode == AttentionMode::kPrefix) {
        std::vector<int32_t> sequence = all;
        sequence.insert(sequence.end(), result->tokens.begin(), result->tokens.end());
        reference = CausalReference(weights, sequence, all.size() - 1);
      } else {
        reference = PlacedDocumentsReference(weights, {}, request.docs, request.prompt, result->tokens);
      }
      ExpectStepsMatch(*result, reference, AttentionModeName(mode));
      results[mode] = *std::move(result);
    }
    // Lazy and block: the same function.
    const GenerateResult& lazy = results[AttentionMode::kLazy];
    const GenerateResult& block = results[AttentionMode::kBlock];
    EXPECT_EQ(lazy.tokens, block.tokens);
    for (size_t s = 0; s < std::min(lazy.step_logits.size(), block.step_logits.size()); ++s) {
      EXPECT_LT(RelativeError(lazy.step_logits[s], block.step_logits[s]), kTolerance) << "step " << s;
    }
    // The references tell the settings apart: block-diagonal differs from causal, and
    // the anchorless engine differs from the BOS-anchored one.
    const auto causal = CausalReference(weights, all, all.size() - 1);
    EXPECT_GT(RelativeError(lazy.step_logits[0], causal[0]), 10 * kTolerance)
        << "block-diagonal equals causal attention: the test could not tell a wrong mask";
    auto anchored = MakeEngineWithAnchor(weights, AttentionMode::kLazy, bs, {});  // default: BOS
    auto with_bos = anchored->Generate(request);
    ASSERT_TRUE(with_bos.ok()) << with_bos.status();
    EXPECT_EQ(with_bos->prompt_token_ids.size(), all.size() + 1);
    EXPECT_GT(RelativeError(with_bos->step_logits[0], lazy.step_logits[0]), 10 * kTolerance)
        << "the anchorless engine computed the anchored function";
  }
}

INSTANTIATE_TEST_SUITE_P(AllRopeVariants, AnchorlessReferenceTest, ::testing::Values("tiny", "tiny-hf", "tiny-llama3"));

TEST(AnchorlessReferenceTest, ReusedChunksInAnotherOrderEqualComputedOnes) {
  // The second request reuses the first's documents (no anchor chunk anywhere), placed
  // in another order: its logits equal a fresh engine's, which computes them, and the
  // reference.
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  const ModelWeights weights = RandomModel("tiny-llama3", seed);
  const int vocab = weights.config.vocab_size;
  std::vector<std::vector<int32_t>> corpus;
  for (int d = 0; d < 4; ++d) {
    corpus.push_back(RandomTokens(rng, std::uniform_int_distribution<int>(3, 30)(rng), vocab));
  }
  GenerateRequest first;
  first.docs = corpus;
  first.prompt = RandomTokens(rng, 5, vocab);
  first.sampling.max_tokens = 3;
  GenerateRequest second;
  second.docs = corpus;
  while (second.docs == corpus) std::shuffle(second.docs.begin(), second.docs.end(), rng);
  second.prompt = RandomTokens(rng, std::uniform_int_distribution<int>(1, 8)(rng), vocab);
  second.sampling.max_tokens = 4;
  second.record_logits = true;
  int document_tokens = 0;
  for (const auto& doc : corpus) document_tokens += static_cast<int>(doc.size());
  const int bs = std::uniform_int_distribution<int>(3, 16)(rng);
  for (AttentionMode mode : {AttentionMode::kLazy, AttentionMode::kBlock}) {
    SCOPED_TRACE(AttentionModeName(mode));
    auto warm = MakeAnchorlessEngine(weights, mode, bs);
    ASSERT_TRUE(warm->Generate(first).ok());
    auto reused = warm->Generate(second);
    ASSERT_TRUE(reused.ok()) << reused.status();
    EXPECT_EQ(reused->usage.chunk_hits, 4);
    EXPECT_EQ(reused->usage.chunk_misses, 0);
    EXPECT_EQ(reused->usage.cached_documents, 4);
    EXPECT_EQ(reused->usage.document_cached_tokens, document_tokens);
    EXPECT_EQ(reused->usage.cached_tokens, document_tokens) << "no anchor tokens to reuse";
    EXPECT_EQ(reused->usage.computed_tokens, static_cast<int>(second.prompt.size()));
    EXPECT_EQ(warm->stats().cached_entries, 4u) << "the documents only: no anchor chunk";
    ExpectNoLeakedBlocks(*warm);

    auto cold = MakeAnchorlessEngine(weights, mode, bs);
    auto computed = cold->Generate(second);
    ASSERT_TRUE(computed.ok()) << computed.status();
    EXPECT_EQ(computed->usage.chunk_misses, 4);
    EXPECT_EQ(reused->tokens, computed->tokens);
    ASSERT_EQ(reused->step_logits.size(), computed->step_logits.size());
    for (size_t s = 0; s < reused->step_logits.size(); ++s) {
      EXPECT_LT(RelativeError(reused->step_logits[s], computed->step_logits[s]), 1e-6) << "step " << s;
    }
    ExpectStepsMatch(*reused, PlacedDocumentsReference(weights, {}, second.docs, second.prompt, reused->tokens),
                     "reused");

    // A BOS-anchored engine sharing nothing with these keys: its chunks are its own.
    auto anchored = MakeEngineWithAnchor(weights, mode, bs, {});
    auto with_bos = anchored->Generate(second);
    ASSERT_TRUE(with_bos.ok()) << with_bos.status();
    EXPECT_EQ(with_bos->usage.chunk_misses, 5) << "the BOS anchor and four documents";
  }
}

TEST(AnchorlessReferenceTest, EmptyPromptAndPrefixReuse) {
  // With an empty prompt the last document is the request's own tokens; prefix mode reuses
  // the anchorless chain of a request with the same start.
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  const ModelWeights weights = RandomModel("tiny-hf", seed);
  const int vocab = weights.config.vocab_size;
  GenerateRequest request;
  request.docs = {RandomTokens(rng, 11, vocab), {}, RandomTokens(rng, 17, vocab), RandomTokens(rng, 5, vocab)};
  request.sampling.max_tokens = 3;
  request.record_logits = true;
  auto shared = request.docs;
  const std::vector<int32_t> own = shared.back();
  shared.pop_back();
  for (AttentionMode mode : {AttentionMode::kLazy, AttentionMode::kBlock}) {
    auto engine = MakeAnchorlessEngine(weights, mode, 8);
    auto result = engine->Generate(request);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->usage.chunk_misses, 2) << "two shared documents, no anchor";
    EXPECT_EQ(result->usage.document_computed_tokens, 33);
    ExpectStepsMatch(*result, PlacedDocumentsReference(weights, {}, shared, own, result->tokens),
                     AttentionModeName(mode));
  }
  auto prefix = MakeAnchorlessEngine(weights, AttentionMode::kPrefix, 4);
  ASSERT_TRUE(prefix->Generate(request).ok());
  GenerateRequest longer = request;
  longer.prompt = RandomTokens(rng, 6, vocab);
  auto result = prefix->Generate(longer);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->usage.cached_tokens, 32) << "the 33 document tokens' full blocks of 4";
  const std::vector<int32_t> all = Concatenated(longer.docs, longer.prompt);
  std::vector<int32_t> sequence = all;
  sequence.insert(sequence.end(), result->tokens.begin(), result->tokens.end());
  ExpectStepsMatch(*result, CausalReference(weights, sequence, all.size() - 1), "prefix");
}

TEST(AnchorlessReferenceTest, RejectsAnchorTokensAndEmptyRequests) {
  const ModelWeights weights = RandomModel("tiny", FreshSeed());
  EngineOptions options;
  options.anchorless = true;
  options.anchor = {weights.config.bos_id};
  auto backend = CreateCpuBackend(weights, 16, 64);
  ASSERT_TRUE(backend.ok()) << backend.status();
  auto refused = Engine::Create(*std::move(backend), options);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  for (AttentionMode mode :
       {AttentionMode::kNone, AttentionMode::kPrefix, AttentionMode::kLazy, AttentionMode::kBlock}) {
    auto engine = MakeAnchorlessEngine(weights, mode, 16);
    GenerateRequest empty;
    empty.docs = {{}, {}};
    EXPECT_EQ(engine->Submit(empty).status().code(), absl::StatusCode::kInvalidArgument);
    GenerateRequest one_token;
    one_token.prompt = {7};
    one_token.sampling.max_tokens = 2;
    auto result = engine->Generate(one_token);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->prompt_token_ids, std::vector<int32_t>{7});
    ExpectNoLeakedBlocks(*engine);
  }
}

}  // namespace
}  // namespace lazykv::testing
