// Lazy and block against an independent statement of what they compute, not against each
// other (both take their rotation deltas from the same engine code, so comparing them
// cannot tell a misplaced document). The reference is the naive dense forward pass
// (tests/test_util.h) over an explicit layout with explicit positions and mask:
//   - the anchor at positions [0, a);
//   - each document k at its logical positions [s_k, s_k + len_k), attending causally to
//     itself and to its own copy of the anchor placed just before it, at [s_k - a, s_k)
//     (a document's KV is computed after the anchor alone: DESIGN.md section 2);
//   - the prompt (then each generated token) after the documents, attending to the anchor,
//     to every document's tokens (not the anchor copies) and causally to itself.
// A delta that shifts documents, a chunk encoded without its anchor, a mask that lets
// documents see each other, or wrong RoPE frequencies all move the logits.
#include <algorithm>
#include <random>

#include "gtest/gtest.h"
#include "tests/engine/engine_compare_util.h"
#include "tests/engine/engine_test_util.h"
#include "tests/test_util.h"
#include "worker/backend/cpu_backend.h"
#include "worker/model/llama2c_loader.h"
#include "worker/model/synthetic_model.h"
#include "worker/tokenizer/tokenizer.h"

namespace lazykv::testing {
namespace {

constexpr double kTolerance = 1e-4;

std::unique_ptr<Engine> MakeEngineWithAnchor(const ModelWeights& weights, AttentionMode mode, int block_size,
                                             std::vector<int32_t> anchor) {
  EngineOptions options;
  options.mode = mode;
  options.anchor = std::move(anchor);
  return MakeEngine(weights, std::move(options), block_size);
}

// Logits of the reference at each tail position from the prompt's last token on: entry s
// is what the engine's step s (record_logits) must equal.
std::vector<std::vector<float>> PlacedDocumentsReference(const ModelWeights& w, const std::vector<int32_t>& anchor,
                                                         const std::vector<std::vector<int32_t>>& docs,
                                                         const std::vector<int32_t>& prompt,
                                                         const std::vector<int32_t>& generated) {
  constexpr int kAnchor = -1, kTail = -2;  // groups; documents are 0, 1, ...
  std::vector<int32_t> tokens;
  std::vector<int64_t> positions;
  std::vector<int> group;
  std::vector<bool> is_copy;  // an anchor copy (seen by its document only)
  auto add = [&](int32_t token, int64_t position, int g, bool copy) {
    tokens.push_back(token);
    positions.push_back(position);
    group.push_back(g);
    is_copy.push_back(copy);
  };
  const int64_t a = static_cast<int64_t>(anchor.size());
  for (int64_t i = 0; i < a; ++i) add(anchor[i], i, kAnchor, false);
  int64_t start = a;
  int k = 0;
  for (const auto& doc : docs) {
    if (doc.empty()) continue;
    for (int64_t i = 0; i < a; ++i) add(anchor[i], start - a + i, k, true);
    for (size_t j = 0; j < doc.size(); ++j) add(doc[j], start + static_cast<int64_t>(j), k, false);
    start += static_cast<int64_t>(doc.size());
    ++k;
  }
  const size_t tail_begin = tokens.size();
  std::vector<int32_t> tail = prompt;
  tail.insert(tail.end(), generated.begin(), generated.end());
  for (size_t j = 0; j < tail.size(); ++j) add(tail[j], start + static_cast<int64_t>(j), kTail, false);

  auto visible = [&](size_t q, size_t key) {
    if (key > q) return false;  // every group is laid out in order: causal within it
    if (group[q] == kTail) return !is_copy[key];
    return group[key] == group[q];  // the anchor sees itself; a document its copy and itself
  };
  std::vector<bool> want(tokens.size(), false);
  for (size_t i = tail_begin + prompt.size() - 1; i < tokens.size(); ++i) want[i] = true;
  auto logits = NaiveForwardMasked(w, tokens, positions, visible, want);
  return std::vector<std::vector<float>>(logits.begin() + tail_begin + prompt.size() - 1, logits.end());
}

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
    GenerateRequest request;
    const int docs = std::uniform_int_distribution<int>(2, 4)(rng);
    for (int d = 0; d < docs; ++d) {
      request.docs.push_back(RandomTokens(rng, std::uniform_int_distribution<int>(1, 30)(rng), vocab));
    }
    request.prompt = RandomTokens(rng, std::uniform_int_distribution<int>(1, 9)(rng), vocab);
    request.sampling.max_tokens = 4;
    request.record_logits = true;
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

}  // namespace
}  // namespace lazykv::testing
