// GenerationLoop's idle spin (GenerationLoopOptions::idle_spin): a request posted while the idle
// engine thread watches is taken by the watch (counted as caught), one posted after the watch
// ran out wakes the sleeping thread, Stop ends a watch at once, and every request still gets
// the tokens it gets alone; with no spin nothing is counted. The watches' outcomes are the
// worker's metric lazykv_worker_engine_idle_watches_total.
#include "worker/serve/generation_loop.h"

#include <chrono>
#include <random>

#include "gtest/gtest.h"
#include "tests/engine/engine_test_util.h"
#include "tests/test_util.h"
#include "worker/model/synthetic_model.h"

namespace lazykv::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

// A request's sampled tokens, or the status it failed with.
absl::StatusOr<std::vector<int32_t>> Drain(RequestStream& stream) {
  std::vector<int32_t> tokens;
  while (true) {
    std::optional<EngineEvent> event = stream.Next(milliseconds(30000));
    if (!event) return absl::DeadlineExceededError("no event in 30 s");
    switch (event->kind) {
      case EngineEvent::Kind::kToken:
        tokens.push_back(event->token.id);
        break;
      case EngineEvent::Kind::kFinished:
        return tokens;
      case EngineEvent::Kind::kFailed:
        return event->status;
    }
  }
}

// The value of lazykv_worker_engine_idle_watches_total{outcome}.
double IdleWatches(const WorkerMetrics& metrics, const std::string& outcome) {
  for (const prometheus::MetricFamily& family : metrics.registry()->Collect()) {
    if (family.name != "lazykv_worker_engine_idle_watches_total") continue;
    for (const prometheus::ClientMetric& metric : family.metric) {
      for (const prometheus::ClientMetric::Label& label : metric.label) {
        if (label.name == "outcome" && label.value == outcome) return metric.counter.value;
      }
    }
  }
  ADD_FAILURE() << "no idle watches counter with outcome " << outcome;
  return -1;
}

struct Fixture {
  explicit Fixture(uint64_t seed) : weights(MakeSyntheticWeights(*SyntheticConfig("tiny"), seed)) {
    std::mt19937_64 rng(seed);
    request.docs = {RandomTokens(rng, 20, 512), RandomTokens(rng, 30, 512)};
    request.prompt = RandomTokens(rng, 6, 512);
    request.sampling.max_tokens = 5;
  }
  ModelWeights weights;
  GenerateRequest request;
};

TEST(GenerationLoopTest, IdleSpinTakesWhatIsPostedWhileItWatches) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  Fixture f(seed);
  // Long enough for the test thread's next post under ThreadSanitizer too.
  const auto kSpin = milliseconds(1500) * SlowdownFactor();
  auto metrics = std::make_shared<WorkerMetrics>();
  GenerationLoop loop(MakeEngine(f.weights, AttentionMode::kLazy), metrics, GenerationLoopOptions{.idle_spin = kSpin});
  // The loop starts idle and watching: the first request is caught, and so is the second,
  // posted as soon as the first has ended.
  auto first = Drain(*loop.Submit(f.request));
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->size(), 5u);
  auto second = Drain(*loop.Submit(f.request));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(*second, *first) << "the same greedy request, the same tokens";
  EXPECT_EQ(loop.idle_spins().caught, 2u);
  EXPECT_EQ(loop.idle_spins().expired, 0u);
  // Past the watch the thread sleeps; a request wakes it.
  EXPECT_TRUE(Eventually([&] { return loop.idle_spins().expired == 1; }, 3 * kSpin));
  auto third = Drain(*loop.Submit(f.request));
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ(*third, *first);
  EXPECT_EQ(loop.idle_spins().caught, 2u) << "woken from its sleep, not caught";
  // Stop ends the watch the third request's end began, well before it runs out.
  const auto stop_start = steady_clock::now();
  loop.Stop();
  EXPECT_LT(steady_clock::now() - stop_start, kSpin / 2);
  EXPECT_EQ(loop.idle_spins().caught, 3u) << "Stop posted";
  EXPECT_EQ(IdleWatches(*metrics, "took_work"), 3);
  EXPECT_EQ(IdleWatches(*metrics, "ran_out"), 1);
}

TEST(GenerationLoopTest, NoSpinSleepsAtOnce) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  Fixture f(seed);
  auto metrics = std::make_shared<WorkerMetrics>();
  GenerationLoop loop(MakeEngine(f.weights, AttentionMode::kLazy), metrics);
  auto first = Drain(*loop.Submit(f.request));
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = Drain(*loop.Submit(f.request));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(*second, *first);
  loop.Stop();
  EXPECT_EQ(loop.idle_spins().caught, 0u);
  EXPECT_EQ(loop.idle_spins().expired, 0u);
  EXPECT_EQ(IdleWatches(*metrics, "took_work"), 0);
  EXPECT_EQ(IdleWatches(*metrics, "ran_out"), 0);
}

}  // namespace
}  // namespace lazykv::testing
