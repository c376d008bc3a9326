// Engine::WarmUpBackend covers every pass the engine then runs: the rows of new tokens and
// the rows of logits of each forward pass of a busy batch (documents, repaired heads,
// chunked prefill beside decoding, more requests than may run at once) stay within what it
// asked the backend to prepare. A pass past them would plan a GEMM shape inside a step on a
// GPU (cuda_warm_up_test checks the GPU side). The reference is the passes as the backend
// receives them, counted by a wrapper.
#include <algorithm>
#include <random>

#include "gtest/gtest.h"
#include "tests/engine/engine_compare_util.h"
#include "tests/engine/engine_test_util.h"
#include "tests/engine/forwarding_backend.h"
#include "tests/test_util.h"
#include "worker/backend/cpu_backend.h"
#include "worker/model/synthetic_model.h"

namespace lazykv::testing {
namespace {

// The CPU backend, recording what WarmUp was asked for and the largest pass it ran.
class PassRecorder : public ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  absl::Status Forward(std::span<const SequenceStep> steps, std::vector<std::vector<float>>* logits) override {
    int rows = 0, logit_rows = 0;
    for (const SequenceStep& step : steps) {
      rows += static_cast<int>(step.tokens.size());
      if (step.logits == LogitsWanted::kLast && !step.tokens.empty()) ++logit_rows;
      if (step.logits == LogitsWanted::kAll) logit_rows += static_cast<int>(step.tokens.size());
    }
    max_rows = std::max(max_rows, rows);
    max_logit_rows = std::max(max_logit_rows, logit_rows);
    ++passes;
    return ForwardingBackend::Forward(steps, logits);
  }
  absl::Status WarmUp(int rows, int logit_rows) override {
    warm_rows = rows;
    warm_logit_rows = logit_rows;
    return ForwardingBackend::WarmUp(rows, logit_rows);
  }

  int warm_rows = -1, warm_logit_rows = -1;
  int max_rows = 0, max_logit_rows = 0, passes = 0;
};

TEST(EngineWarmUpTest, EveryPassOfABusyBatchStaysWithinWhatTheWarmUpPrepared) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  const ModelConfig config = *SyntheticConfig("tiny");
  const ModelWeights weights = MakeSyntheticWeights(config, seed);
  for (AttentionMode mode : {AttentionMode::kLazy, AttentionMode::kBlock, AttentionMode::kNone}) {
    SCOPED_TRACE(AttentionModeName(mode));
    auto cpu = CreateCpuBackend(weights, 8, 4096);
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    auto recorder = std::make_unique<PassRecorder>(*std::move(cpu));
    PassRecorder* seen = recorder.get();
    EngineOptions options;
    options.mode = mode;
    options.max_prefill_tokens = std::uniform_int_distribution<int>(5, 40)(rng);
    options.max_running_requests = std::uniform_int_distribution<int>(2, 9)(rng);
    options.max_queued_requests = 64;
    auto engine = Engine::Create(std::move(recorder), options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    ASSERT_TRUE((*engine)->WarmUpBackend().ok());
    EXPECT_EQ(seen->warm_rows, options.max_prefill_tokens + options.max_running_requests);
    EXPECT_EQ(seen->warm_logit_rows, options.max_running_requests);
    std::vector<std::vector<int32_t>> corpus;
    for (int d = 0; d < 6; ++d) corpus.push_back(RandomTokens(rng, 3 + rng() % 50, config.vocab_size));
    for (int r = 0; r < 20; ++r) {
      GenerateRequest request;
      for (int k = 0, n = 1 + rng() % 4; k < n; ++k) request.docs.push_back(corpus[rng() % corpus.size()]);
      request.prompt = RandomTokens(rng, 1 + rng() % 30, config.vocab_size);
      request.sampling.max_tokens = 1 + rng() % 12;
      if (mode != AttentionMode::kNone && r % 3 == 0) request.repair_tokens = 1 + rng() % 10;
      ASSERT_TRUE((*engine)->Submit(request).ok());
    }
    StepUntilIdle(**engine, 20);
    EXPECT_GT(seen->passes, 0);
    EXPECT_LE(seen->max_rows, seen->warm_rows) << "a pass had more rows than the warm-up prepared";
    EXPECT_LE(seen->max_logit_rows, seen->warm_logit_rows) << "a pass wanted more logits than prepared";
    // The bound is not idle: the busiest pass used most of it.
    EXPECT_GT(seen->max_rows, options.max_prefill_tokens / 2);
    ExpectNoLeakedBlocks(**engine);
  }
}

}  // namespace
}  // namespace lazykv::testing
