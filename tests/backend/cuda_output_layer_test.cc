// The CUDA backend's batched output layer and its sampling: the logits of a mixed batch
// (decodes, a prefill wanting every row, one wanting none, a fresh prompt) against each
// sequence run alone (one classifier GEMM per sequence, as before the batching), within the
// bf16 noise of a different batch shape; and ForwardAndSample's tokens against the host
// sampler on the very logits the same step returns (greedy exactly, tempered up to
// rounding at 1e-6 of the mass), with and without a gather of the rows. Skips without a GPU.
#include <algorithm>
#include <cstdio>
#include <random>

#include "gtest/gtest.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/test_util.h"
#include "worker/backend/cuda_backend.h"
#include "worker/model/synthetic_model.h"

namespace lazykv::testing {
namespace {

constexpr int kBlocksPerSeq = 8;

// A sequence in its own blocks; the table covers every token so far.
struct Seq {
  int first_block = 0;
  int length = 0;
  std::vector<int32_t> next;  // the tokens of the next step
  std::vector<KvBlockRef> table;

  void Advance(std::vector<int32_t> tokens) {
    next = std::move(tokens);
    length += static_cast<int>(next.size());
    table.clear();
    for (int done = 0, b = first_block; done < length; done += 16, ++b) {
      table.push_back(KvBlockRef{b, std::min(16, length - done), 0});
    }
  }
  SequenceStep Step(LogitsWanted logits) const { return SequenceStep{next, table, logits}; }
};

std::unique_ptr<Backend> SmallGpuBackend(uint64_t seed) {
  auto backend = CreateSyntheticCudaBackend(*SyntheticConfig("small"), seed, 16, 6 * kBlocksPerSeq);
  EXPECT_TRUE(backend.ok()) << backend.status();
  return backend.ok() ? *std::move(backend) : nullptr;
}

// Prompts of these lengths in sequences 0..n-1, run one at a time on every backend.
std::vector<Seq> Prefill(std::mt19937_64& rng, const std::vector<int>& lengths, std::vector<Backend*> backends) {
  std::vector<Seq> seqs(lengths.size());
  for (size_t i = 0; i < lengths.size(); ++i) {
    seqs[i].first_block = static_cast<int>(i) * kBlocksPerSeq;
    seqs[i].Advance(RandomTokens(rng, lengths[i], backends[0]->config().vocab_size));
    const SequenceStep step = seqs[i].Step(LogitsWanted::kNone);
    std::vector<std::vector<float>> unused;
    for (Backend* b : backends) EXPECT_TRUE(b->Forward({&step, 1}, &unused).ok());
  }
  return seqs;
}

TEST(CudaOutputLayerTest, BatchedLogitsMatchEachSequenceAlone) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  auto batched = SmallGpuBackend(seed), alone = SmallGpuBackend(seed);
  ASSERT_TRUE(batched && alone);
  const int vocab = batched->config().vocab_size;
  std::vector<Seq> seqs = Prefill(rng, {20, 33, 5, 17, 0}, {batched.get(), alone.get()});
  const std::vector<int> new_tokens = {1, 1, 3, 4, 12};
  const std::vector<LogitsWanted> wants = {LogitsWanted::kLast, LogitsWanted::kLast, LogitsWanted::kAll,
                                           LogitsWanted::kNone, LogitsWanted::kLast};
  std::vector<SequenceStep> steps;
  for (size_t i = 0; i < seqs.size(); ++i) {
    seqs[i].Advance(RandomTokens(rng, new_tokens[i], vocab));
    steps.push_back(seqs[i].Step(wants[i]));
  }
  std::vector<std::vector<float>> got;
  ASSERT_TRUE(batched->Forward(steps, &got).ok());
  ASSERT_EQ(got.size(), steps.size());
  double worst = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    std::vector<std::vector<float>> want;
    ASSERT_TRUE(alone->Forward({&steps[i], 1}, &want).ok());
    const size_t rows = wants[i] == LogitsWanted::kNone ? 0 : wants[i] == LogitsWanted::kLast ? 1 : new_tokens[i];
    ASSERT_EQ(got[i].size(), rows * vocab) << "step " << i;
    ASSERT_EQ(want[0].size(), rows * vocab) << "step " << i;
    if (rows == 0) continue;
    const double error = RelativeError(got[i], want[0]);
    worst = std::max(worst, error);
    EXPECT_LT(error, 3e-2) << "step " << i;  // bf16 noise; a wrong row is of order 1
  }
  std::printf("batched output layer: worst relative logit difference to each sequence alone %.1e\n", worst);
}

// One step three times on one backend (deterministic): sampling without logits, with them,
// and Forward. The tokens agree, and equal the host sampler's on those logits.
void CheckSampledStep(Backend& backend, const std::vector<SequenceStep>& steps, std::vector<StepSampling> sampling) {
  std::vector<SampledToken> plain, kept;
  std::vector<std::vector<float>> no_logits, logits, forward;
  ASSERT_TRUE(backend.ForwardAndSample(steps, sampling, &plain, &no_logits).ok());
  for (StepSampling& s : sampling) s.keep_logits = s.sample;
  ASSERT_TRUE(backend.ForwardAndSample(steps, sampling, &kept, &logits).ok());
  ASSERT_TRUE(backend.Forward(steps, &forward).ok());
  for (size_t i = 0; i < steps.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "step " << i);
    EXPECT_EQ(logits[i], forward[i]);
    if (!sampling[i].sample) {
      EXPECT_EQ(plain[i].id, -1);
      EXPECT_EQ(no_logits[i], forward[i]);  // unsampled rows come back as Forward gives them
      continue;
    }
    EXPECT_TRUE(no_logits[i].empty());
    EXPECT_EQ(plain[i].id, kept[i].id);
    const SampledToken host = SampleRow(forward[i], sampling[i].row);
    if (kept[i].id != host.id) {
      // Only a tempered draw may part, and only within rounding of the host's target.
      EXPECT_NE(sampling[i].row.temperature, 0.0f);
      bool explained = false;
      for (double du : {-1e-6, 1e-6}) {
        RowSampling moved = sampling[i].row;
        moved.uniform = std::clamp(moved.uniform + du, 0.0, 0.9999999);
        explained = explained || SampleRow(forward[i], moved).id == kept[i].id;
      }
      EXPECT_TRUE(explained) << "GPU " << kept[i].id << ", host " << host.id;
    } else {
      EXPECT_NEAR(kept[i].logprob, host.logprob, 1e-4);
    }
  }
}

TEST(CudaOutputLayerTest, SampledTokensAreTheHostSamplersOnTheSameLogits) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  auto backend = SmallGpuBackend(seed);
  ASSERT_TRUE(backend);
  const int vocab = backend->config().vocab_size;
  std::vector<Seq> seqs = Prefill(rng, {20, 33, 5, 17, 9}, {backend.get()});
  auto sample = [&](float temperature, float top_p) {
    return StepSampling{.sample = true,
                        .row = RowSampling{.temperature = temperature, .top_p = top_p, .uniform = unit(rng)},
                        .keep_logits = false};
  };
  // Mixed: four decodes and a prefill wanting every row (the rows are gathered).
  std::vector<SequenceStep> steps;
  for (size_t i = 0; i < seqs.size(); ++i) {
    seqs[i].Advance(RandomTokens(rng, i == 4 ? 3 : 1, vocab));
    steps.push_back(seqs[i].Step(i == 4 ? LogitsWanted::kAll : LogitsWanted::kLast));
  }
  CheckSampledStep(*backend, steps, {sample(0, 1), sample(1, 1), sample(0.7f, 0.9f), sample(1, 0.1f), {}});
  // Decode only: every row wants logits (no gather), the decode attention kernel.
  steps.clear();
  for (Seq& s : seqs) {
    s.Advance(RandomTokens(rng, 1, vocab));
    steps.push_back(s.Step(LogitsWanted::kLast));
  }
  CheckSampledStep(*backend, steps, {sample(0, 1), {}, sample(1.2f, 0.5f), sample(0, 1), sample(0.9f, 1)});
}

}  // namespace
}  // namespace lazykv::testing
