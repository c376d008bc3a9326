// Comparing two engines' greedy generations (the GPU tests: CUDA against CPU, lazy against
// block): engines over a backend, the stories260K documents, where two token paths part
// and by how much the reference preferred its own token there, and logit differences
// along the common path.
#pragma once

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/test_util.h"
#include "worker/engine/engine.h"

namespace lazykv::testing {

inline std::unique_ptr<Engine> EngineOn(absl::StatusOr<std::unique_ptr<Backend>> backend, AttentionMode mode) {
  EXPECT_TRUE(backend.ok()) << backend.status();
  if (!backend.ok()) return nullptr;
  EngineOptions options;
  options.mode = mode;
  auto engine = Engine::Create(*std::move(backend), options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? *std::move(engine) : nullptr;
}

// Short stories in stories260K's domain, used as RAG documents.
inline const std::vector<std::string>& StoryTexts() {
  static const std::vector<std::string> texts = {
      "Lily had a big red ball. She liked to throw it high in the sky.",
      "Tom was a little dog who lived in a small house near the park.",
      "The sun was hot, so Sam and his mom went to the beach to swim.",
      "Once there was a cat named Max. Max loved to eat fish and sleep.",
      "Anna found a shiny key under a tree. She wondered what it could open.",
  };
  return texts;
}

// `count` random documents of 5 to 70 tokens (the random-model tests' corpus).
inline std::vector<std::vector<int32_t>> RandomDocuments(std::mt19937_64& rng, int vocab_size, int count = 4) {
  std::vector<std::vector<int32_t>> docs;
  for (int d = 0; d < count; ++d) {
    docs.push_back(RandomTokens(rng, std::uniform_int_distribution<int>(5, 70)(rng), vocab_size));
  }
  return docs;
}

// Three of `corpus` in a fresh order, then a random prompt of 1 to 9 tokens; 6 new tokens
// with their logits recorded.
inline GenerateRequest RandomRagRequest(std::mt19937_64& rng, std::vector<std::vector<int32_t>>& corpus,
                                        int vocab_size) {
  std::shuffle(corpus.begin(), corpus.end(), rng);
  GenerateRequest request;
  request.docs.assign(corpus.begin(), corpus.begin() + 3);
  request.prompt = RandomTokens(rng, std::uniform_int_distribution<int>(1, 9)(rng), vocab_size);
  request.sampling.max_tokens = 6;
  request.record_logits = true;
  return request;
}

// A synthetic model's name as a test-parameter name ("tiny-llama3" -> "tiny_llama3").
inline std::string SyntheticModelParamName(const ::testing::TestParamInfo<std::string>& info) {
  std::string name = info.param;
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

inline size_t CommonPrefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

// How much `logits` prefer token `preferred` over token `other`, relative to the step's
// largest |logit|.
inline double RelativeMargin(const std::vector<float>& logits, int32_t preferred, int32_t other) {
  float scale = 0;
  for (float v : logits) scale = std::max(scale, std::abs(v));
  return (logits[preferred] - logits[other]) / static_cast<double>(scale);
}

// The common prefix of `got` and `reference` (which recorded its logits); where they part,
// expects the reference's margin of its token over got's token to be below `tie` (a
// near-tie, not a wrong computation), and returns that margin in *margin (0 when they do
// not part).
inline size_t CheckParting(const GenerateResult& got, const GenerateResult& reference, const std::string& what,
                           double tie, double* margin) {
  const size_t common = CommonPrefix(got.tokens, reference.tokens);
  *margin = 0;
  if (common < got.tokens.size() && common < reference.tokens.size() && common < reference.step_logits.size()) {
    *margin = RelativeMargin(reference.step_logits[common], reference.tokens[common], got.tokens[common]);
    EXPECT_LT(*margin, tie) << what << ": the paths part at token " << common << " where the reference "
                            << "prefers its token by more than a near-tie";
  }
  return common;
}

// The largest relative logit difference over the steps where `a` and `b` chose the same
// tokens (and the step after, where they part).
inline double WorstLogitError(const GenerateResult& a, const GenerateResult& b) {
  const size_t common = CommonPrefix(a.tokens, b.tokens);
  double worst = 0;
  for (size_t s = 0; s <= common && s < a.step_logits.size() && s < b.step_logits.size(); ++s) {
    worst = std::max(worst, RelativeError(a.step_logits[s], b.step_logits[s]));
  }
  return worst;
}

}  // namespace lazykv::testing
