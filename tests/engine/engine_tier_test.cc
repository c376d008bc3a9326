// The engine with a cache tier that misbehaves (slow on every call, full, corrupt, dying
// mid-fetch): the outputs equal the engine without a tier, no block or lease leaks, and
// the scheduling thread never waits for the tier. And a warm tier serves a fresh engine,
// with usage that says where every chunk came from.
#include <gtest/gtest.h>

#include <random>
#include <thread>

#include "tests/engine/engine_test_util.h"
#include "tests/fake_chunk_tier.h"
#include "tests/test_util.h"
#include "worker/model/model_loader.h"

namespace lazykv {
namespace {

using std::chrono::milliseconds;
using testing::FakeChunkTier;
using Clock = std::chrono::steady_clock;

struct Workload {
  ModelWeights weights;
  std::vector<GenerateRequest> requests;
  std::vector<std::vector<int32_t>> expected;  // tokens from the engine without a tier
};

// Six requests over eight random documents (shared between requests), greedy.
Workload MakeWorkload(std::mt19937_64& rng) {
  Workload s;
  s.weights = *LoadModel("synthetic:tiny:" + std::to_string(rng() % 1000));
  const int vocab = s.weights.config.vocab_size;
  std::vector<std::vector<int32_t>> docs;
  for (int d = 0; d < 8; ++d) docs.push_back(testing::RandomTokens(rng, 10 + rng() % 40, vocab));
  for (int r = 0; r < 6; ++r) {
    GenerateRequest request;
    for (int k = 0; k < 3; ++k) request.docs.push_back(docs[rng() % docs.size()]);
    request.prompt = testing::RandomTokens(rng, 5, vocab);
    request.sampling.max_tokens = 6;
    s.requests.push_back(request);
  }
  auto reference = testing::MakeEngine(s.weights, AttentionMode::kLazy);
  for (const GenerateRequest& request : s.requests) s.expected.push_back(reference->Generate(request)->tokens);
  return s;
}

std::unique_ptr<Engine> EngineWithTier(const ModelWeights& weights, std::shared_ptr<FakeChunkTier> tier,
                                       FetchPolicy policy = FetchPolicy::kAlways) {
  EngineOptions options;
  options.tier = std::move(tier);
  options.pipeline.fetch_policy = policy;
  return testing::MakeEngine(weights, std::move(options));
}

struct RunResult {
  std::vector<GenerateResult> results;
  Clock::duration longest_step{0};
};

// Submits every request at once and steps until all finish, timing each Step.
RunResult RunAll(Engine& engine, const std::vector<GenerateRequest>& requests) {
  RunResult out;
  std::map<RequestId, size_t> index;
  for (size_t i = 0; i < requests.size(); ++i) index[*engine.Submit(requests[i])] = i;
  out.results.resize(requests.size());
  size_t done = 0;
  const auto give_up = Clock::now() + std::chrono::seconds(60) * testing::SlowdownFactor();
  std::vector<EngineEvent> events;
  while (done < requests.size() && Clock::now() < give_up) {
    events.clear();
    const auto start = Clock::now();
    const int ran = engine.Step(&events);
    out.longest_step = std::max(out.longest_step, Clock::now() - start);
    for (EngineEvent& e : events) {
      if (e.kind == EngineEvent::Kind::kFinished) {
        out.results[index.at(e.id)] = *e.result;
        ++done;
      }
      EXPECT_NE(e.kind, EngineEvent::Kind::kFailed) << e.status;
      if (e.kind == EngineEvent::Kind::kFailed) ++done;
    }
    if (ran == 0) engine.WaitForTier(milliseconds(20));
  }
  EXPECT_EQ(done, requests.size());
  return out;
}

void ExpectOutputs(const Workload& s, const RunResult& run, const std::string& what) {
  for (size_t r = 0; r < s.requests.size(); ++r) EXPECT_EQ(run.results[r].tokens, s.expected[r]) << what << " " << r;
}

TEST(EngineTierTest, ATierSleepingOnEveryCallNeverStallsAStep) {
  std::mt19937_64 rng(testing::FreshSeed());
  const Workload s = MakeWorkload(rng);
  auto tier = std::make_shared<FakeChunkTier>();
  const milliseconds sleep(1000);
  tier->SetFaults({.lookup_delay = sleep, .fetch_delay = sleep, .lease_delay = sleep, .publish_delay = sleep});
  auto engine = EngineWithTier(s.weights, tier);
  const RunResult run = RunAll(*engine, s.requests);
  ExpectOutputs(s, run, "slow tier");
  // A step runs a tiny model over a few tokens: far below one tier call.
  EXPECT_LT(run.longest_step, milliseconds(200) * testing::SlowdownFactor());
  engine->pipeline()->Flush();
  testing::ExpectNoLeakedBlocks(*engine);
  EXPECT_EQ(tier->outstanding_leases(), 0u);
}

TEST(EngineTierTest, AWarmTierServesAFreshEngineAndUsageSaysFromWhere) {
  std::mt19937_64 rng(testing::FreshSeed());
  const Workload s = MakeWorkload(rng);
  auto tier = std::make_shared<FakeChunkTier>();
  {
    auto cold = EngineWithTier(s.weights, tier);
    ExpectOutputs(s, RunAll(*cold, s.requests), "cold");
    cold->pipeline()->Flush();
    EXPECT_GT(cold->pipeline()->stats().published, 0u);
    EXPECT_EQ(cold->pipeline()->stats().publish_failures, 0u);
  }
  auto warm = EngineWithTier(s.weights, tier);
  // One at a time, so that each request's chunks are its own fetches or pool hits.
  int host_tokens = 0, misses = 0;
  uint64_t bytes = 0;
  for (size_t r = 0; r < s.requests.size(); ++r) {
    auto result = warm->Generate(s.requests[r]);
    ASSERT_TRUE(result.ok());
    EXPECT_EQ(result->tokens, s.expected[r]) << r;
    const Usage& u = result->usage;
    EXPECT_EQ(u.pool_tokens + u.host_tokens + u.disk_tokens + u.remote_tokens, u.cached_tokens);
    EXPECT_EQ(u.kv_bytes_fetched, u.host_bytes_fetched + u.disk_bytes_fetched + u.remote_bytes_fetched);
    host_tokens += u.host_tokens;
    misses += u.chunk_misses;
    bytes += u.host_bytes_fetched;
  }
  EXPECT_GT(host_tokens, 0);
  EXPECT_EQ(misses, 0);  // every chunk was in the tier
  EXPECT_EQ(bytes, warm->pipeline()->stats().fetched_bytes);
  testing::ExpectNoLeakedBlocks(*warm);
}

TEST(EngineTierTest, RecomputedByChoiceIsCountedApartFromMisses) {
  std::mt19937_64 rng(testing::FreshSeed());
  const Workload s = MakeWorkload(rng);
  auto tier = std::make_shared<FakeChunkTier>();
  {
    auto cold = EngineWithTier(s.weights, tier);
    RunAll(*cold, s.requests);
  }
  auto warm = EngineWithTier(s.weights, tier, FetchPolicy::kNever);
  int recomputes = 0, recomputed_tokens = 0, misses = 0, computed_docs = 0;
  for (size_t r = 0; r < s.requests.size(); ++r) {
    auto result = warm->Generate(s.requests[r]);
    ASSERT_TRUE(result.ok());
    EXPECT_EQ(result->tokens, s.expected[r]) << r;
    recomputes += result->usage.chunk_recomputes;
    recomputed_tokens += result->usage.recomputed_tokens;
    misses += result->usage.chunk_misses;
    computed_docs += result->usage.document_computed_tokens;
    EXPECT_EQ(result->usage.host_tokens, 0);
  }
  EXPECT_GT(recomputes, 0);
  EXPECT_EQ(misses, 0);
  EXPECT_GE(recomputed_tokens, computed_docs);  // documents, and the anchor once
  EXPECT_EQ(tier->fetches(), 0);
  EXPECT_EQ(warm->pipeline()->stats().computed_chosen, static_cast<uint64_t>(recomputes));
}

TEST(EngineTierTest, FullCorruptOrDyingTiersCostComputationsNeverWrongOutputs) {
  std::mt19937_64 rng(testing::FreshSeed());
  const Workload s = MakeWorkload(rng);
  for (int variant = 0; variant < 4; ++variant) {
    auto tier = std::make_shared<FakeChunkTier>();
    {
      auto cold = EngineWithTier(s.weights, tier);
      RunAll(*cold, s.requests);
    }
    FakeChunkTier::Faults faults;
    faults.full = variant == 0;
    faults.corrupt = variant == 1;
    faults.flip_bytes = variant == 2;
    faults.dies_in_fetch = variant == 3;
    faults.fetch_delay = milliseconds(variant == 3 ? 30 : 0);
    tier->SetFaults(faults);
    auto engine = EngineWithTier(s.weights, tier);
    const RunResult run = RunAll(*engine, s.requests);
    ExpectOutputs(s, run, "variant " + std::to_string(variant));
    engine->pipeline()->Flush();
    testing::ExpectNoLeakedBlocks(*engine);
    EXPECT_EQ(tier->outstanding_leases(), 0u) << variant;
    if (variant > 0) {
      EXPECT_GT(engine->pipeline()->stats().computed_failed, 0u) << variant;
    }
  }
}

TEST(EngineTierTest, ACancelledRequestLeavesNoLeaseBehind) {
  std::mt19937_64 rng(testing::FreshSeed());
  const Workload s = MakeWorkload(rng);
  auto tier = std::make_shared<FakeChunkTier>();
  tier->SetFaults({.lease_delay = milliseconds(50)});
  auto engine = EngineWithTier(s.weights, tier);
  std::vector<RequestId> ids;
  for (const GenerateRequest& request : s.requests) ids.push_back(*engine->Submit(request));
  std::vector<EngineEvent> events;
  engine->Step(&events);
  for (RequestId id : ids) engine->Cancel(id, absl::CancelledError("client went away"));
  const auto give_up = Clock::now() + std::chrono::seconds(10) * testing::SlowdownFactor();
  while (engine->HasWork() && Clock::now() < give_up) {
    events.clear();
    if (engine->Step(&events) == 0) engine->WaitForTier(milliseconds(20));
  }
  EXPECT_FALSE(engine->HasWork());
  engine->pipeline()->Flush();
  const auto settle = Clock::now() + std::chrono::seconds(5);
  while (tier->outstanding_leases() > 0 && Clock::now() < settle) std::this_thread::sleep_for(milliseconds(10));
  EXPECT_EQ(tier->outstanding_leases(), 0u);
  testing::ExpectNoLeakedBlocks(*engine);
}

}  // namespace
}  // namespace lazykv

namespace lazykv {
namespace {

// The start-up calibration: a prefill timed alone, handed to the cost model, no block kept,
// the engine's outputs unchanged by it; refused once requests are in.
TEST(EngineTierTest, CalibrationAnchorsThePrefillCostAndLeavesNothingBehind) {
  std::mt19937_64 rng(testing::FreshSeed());
  const Workload s = MakeWorkload(rng);
  auto tier = std::make_shared<FakeChunkTier>();
  auto engine = EngineWithTier(s.weights, tier, FetchPolicy::kAuto);
  const int free_before = engine->stats().free_blocks;
  auto per_token = engine->CalibratePrefill(48, 2);
  ASSERT_TRUE(per_token.ok()) << per_token.status();
  EXPECT_GT(*per_token, 0);
  EXPECT_NEAR(engine->pipeline()->cost_model().CalibratedSecondsPerToken(), *per_token, 1e-9 * *per_token);
  EXPECT_NEAR(engine->pipeline()->cost_model().PrefillSecondsPerToken(), *per_token, 1e-9 * *per_token);
  EXPECT_EQ(engine->stats().free_blocks, free_before);
  EXPECT_FALSE(engine->CalibratePrefill(0, 1).ok());
  ExpectOutputs(s, RunAll(*engine, s.requests), "after calibration");
  testing::ExpectNoLeakedBlocks(*engine);
  ASSERT_TRUE(engine->Submit(s.requests[0]).ok());
  EXPECT_EQ(engine->CalibratePrefill(48, 1).status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace lazykv
