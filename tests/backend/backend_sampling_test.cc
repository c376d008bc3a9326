// Backend::ForwardAndSample's default (the CPU backend's): the tokens of Forward followed by
// SampleRow, logits back only where they are kept, and its argument checks.
#include <random>

#include "gtest/gtest.h"
#include "tests/test_util.h"
#include "worker/backend/cpu_backend.h"
#include "worker/model/synthetic_model.h"

namespace lazykv::testing {
namespace {

// Four sequences in blocks 0-3, each prefilled at once: a chunk (no logits), two prompts
// wanting their last row, one wanting every row.
struct Batch {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<KvBlockRef>> tables;
  std::vector<SequenceStep> steps;

  Batch(std::mt19937_64& rng, int vocab) {
    const std::vector<int> lengths = {9, 5, 7, 4};
    const std::vector<LogitsWanted> wants = {LogitsWanted::kNone, LogitsWanted::kLast, LogitsWanted::kLast,
                                             LogitsWanted::kAll};
    for (size_t i = 0; i < lengths.size(); ++i) {
      tokens.push_back(RandomTokens(rng, lengths[i], vocab));
      tables.push_back({KvBlockRef{static_cast<int32_t>(i), lengths[i], 0}});
    }
    for (size_t i = 0; i < lengths.size(); ++i) steps.push_back(SequenceStep{tokens[i], tables[i], wants[i]});
  }
};

std::unique_ptr<Backend> TinyCpuBackend(uint64_t seed) {
  auto backend = CreateCpuBackend(MakeSyntheticWeights(*SyntheticConfig("tiny"), seed), 16, 8);
  EXPECT_TRUE(backend.ok()) << backend.status();
  return backend.ok() ? *std::move(backend) : nullptr;
}

TEST(BackendSamplingTest, DefaultIsForwardThenSampleRow) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  auto sampled_backend = TinyCpuBackend(seed), plain_backend = TinyCpuBackend(seed);
  ASSERT_TRUE(sampled_backend && plain_backend);
  const Batch batch(rng, sampled_backend->config().vocab_size);
  const std::vector<StepSampling> sampling = {
      StepSampling{}, StepSampling{.sample = true, .row = RowSampling{}, .keep_logits = false},  // greedy
      StepSampling{
          .sample = true, .row = RowSampling{.temperature = 0.8f, .top_p = 0.9f, .uniform = 0.37}, .keep_logits = true},
      StepSampling{}};
  std::vector<SampledToken> tokens;
  std::vector<std::vector<float>> logits, reference;
  ASSERT_TRUE(sampled_backend->ForwardAndSample(batch.steps, sampling, &tokens, &logits).ok());
  ASSERT_TRUE(plain_backend->Forward(batch.steps, &reference).ok());
  ASSERT_EQ(tokens.size(), 4u);
  ASSERT_EQ(logits.size(), 4u);
  const size_t vocab = sampled_backend->config().vocab_size;
  EXPECT_EQ(tokens[0].id, -1);
  EXPECT_TRUE(logits[0].empty());
  for (size_t i : {1, 2}) {
    const SampledToken want = SampleRow(reference[i], sampling[i].row);
    EXPECT_EQ(tokens[i].id, want.id) << "step " << i;
    EXPECT_EQ(tokens[i].logprob, want.logprob) << "step " << i;
    EXPECT_LE(tokens[i].logprob, 0.0f);
  }
  EXPECT_TRUE(logits[1].empty());  // sampled, not kept
  EXPECT_EQ(logits[2], reference[2]);
  EXPECT_EQ(tokens[3].id, -1);
  ASSERT_EQ(logits[3].size(), 4 * vocab);  // unsampled: every row, as Forward gives them
  EXPECT_EQ(logits[3], reference[3]);
}

TEST(BackendSamplingTest, RejectsSamplingThatDoesNotFitTheSteps) {
  std::mt19937_64 rng(3);
  auto backend = TinyCpuBackend(3);
  ASSERT_TRUE(backend);
  const Batch batch(rng, backend->config().vocab_size);
  std::vector<SampledToken> tokens;
  std::vector<std::vector<float>> logits;
  auto run = [&](std::vector<StepSampling> sampling) {
    return backend->ForwardAndSample(batch.steps, sampling, &tokens, &logits);
  };
  const StepSampling greedy{.sample = true, .row = RowSampling{}, .keep_logits = false};
  EXPECT_FALSE(run({StepSampling{}, greedy}).ok());                                  // one entry per step
  EXPECT_FALSE(run({greedy, StepSampling{}, StepSampling{}, StepSampling{}}).ok());  // no logits wanted
  EXPECT_FALSE(run({StepSampling{}, StepSampling{}, StepSampling{}, greedy}).ok());  // every row wanted
  for (const RowSampling& bad : {RowSampling{.temperature = -1.0f, .top_p = 1.0f, .uniform = 0.5},
                                 RowSampling{.temperature = 1.0f, .top_p = 0.0f, .uniform = 0.5},
                                 RowSampling{.temperature = 1.0f, .top_p = 1.0f, .uniform = 1.0}}) {
    EXPECT_FALSE(run({StepSampling{}, StepSampling{.sample = true, .row = bad, .keep_logits = false}, StepSampling{},
                      StepSampling{}})
                     .ok());
  }
  const absl::Status ok = run({StepSampling{}, greedy, greedy, StepSampling{}});
  EXPECT_TRUE(ok.ok()) << ok;
}

}  // namespace
}  // namespace lazykv::testing
