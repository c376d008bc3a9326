// ChunkPipeline over a fake tier that can be slow, hung, full, corrupt or dying, with the
// CPU backend staging and capturing real payloads: what it decides (fetch, compute under
// a lease, compute by choice), what it publishes (checked against the codec), and that a
// misbehaving tier costs a computation, never a wrong chunk, a leaked lease or a caller
// that waits.
#include "worker/engine/chunk_pipeline.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <random>
#include <set>
#include <thread>

#include "common/chunk_mac.h"
#include "tests/fake_chunk_tier.h"
#include "tests/test_util.h"
#include "worker/backend/cpu_backend.h"
#include "worker/model/model_loader.h"

namespace lazykv {
namespace {

using std::chrono::milliseconds;
using testing::FakeChunkTier;
using Clock = std::chrono::steady_clock;

constexpr int kTokens = 20;  // two blocks of 16, the second partial
constexpr int kAnchorTokens = 1;

struct Fixture {
  explicit Fixture(ChunkPipelineOptions options = {}) : rng(testing::FreshSeed()) {
    weights = *LoadModel("synthetic:tiny:" + std::to_string(rng() % 1000));
    backend = *CreateCpuBackend(weights, 16, 64);
    auto owned = std::make_shared<FakeChunkTier>();
    tier = owned.get();
    fingerprint = backend->model_fingerprint();
    pipeline = std::make_unique<ChunkPipeline>(owned, backend.get(), fingerprint, KvDtype::kFp32, options);
  }
  ChunkLayout Layout() const { return MakeChunkLayout(weights.config, KvDtype::kFp32, kTokens, kAnchorTokens); }
  // A random payload of the right layout, and its stored form.
  std::string RandomPayload() {
    std::string payload(Layout().payload_bytes(), '\0');
    std::uniform_real_distribution<float> value(-2, 2);
    for (size_t i = 0; i + sizeof(float) <= payload.size(); i += sizeof(float)) {
      const float v = value(rng);
      std::memcpy(payload.data() + i, &v, sizeof(v));
    }
    return payload;
  }
  std::string Stored(const Hash128& key, const std::string& payload, Hash128 fp = {}) {
    if (fp == Hash128{}) fp = fingerprint;
    return EncodeChunk(MakeChunkHeader(key, fp, Layout(), payload), payload);
  }
  Hash128 RandomKey() { return Hash128{rng(), rng()}; }
  ChunkPipeline::ChunkRequest RequestFor(const Hash128& key) {
    return ChunkPipeline::ChunkRequest{.key = key, .num_tokens = kTokens, .anchor_tokens = kAnchorTokens};
  }
  // Polls until `n` outcomes came (or 10 s).
  std::vector<ChunkOutcome> Await(size_t n) {
    std::vector<ChunkOutcome> out;
    const auto give_up = Clock::now() + std::chrono::seconds(10) * testing::SlowdownFactor();
    while (out.size() < n && Clock::now() < give_up) {
      pipeline->WaitForOutcome(milliseconds(50));
      for (ChunkOutcome& o : pipeline->Poll()) out.push_back(std::move(o));
    }
    return out;
  }
  // Imports a staged chunk into fresh blocks and exports it again.
  std::string RoundTrip(std::unique_ptr<StagedChunk> staged, int first_block) {
    std::vector<KvBlockRef> blocks{{first_block, 16, 0}, {first_block + 1, kTokens - 16, 0}};
    EXPECT_TRUE(backend->ImportStaged(std::move(staged), blocks).ok());
    std::string out;
    EXPECT_TRUE(backend->ExportChunk(blocks, &out).ok());
    return out;
  }

  std::mt19937_64 rng;
  ModelWeights weights;
  std::unique_ptr<Backend> backend;
  FakeChunkTier* tier;
  Hash128 fingerprint;
  std::unique_ptr<ChunkPipeline> pipeline;
};

ChunkPipelineOptions Always() { return ChunkPipelineOptions{.fetch_policy = FetchPolicy::kAlways}; }

TEST(ChunkPipeline, FetchesAStoredChunkAndStagesItsPayload) {
  Fixture f(Always());
  const Hash128 key = f.RandomKey();
  const std::string payload = f.RandomPayload();
  f.tier->Store(key, f.Stored(key, payload));
  f.pipeline->Request({f.RequestFor(key)});
  auto outcomes = f.Await(1);
  ASSERT_EQ(outcomes.size(), 1u);
  ASSERT_TRUE(outcomes[0].fetched);
  EXPECT_EQ(outcomes[0].key, key);
  EXPECT_EQ(outcomes[0].source, ChunkSource::kHost);
  EXPECT_EQ(outcomes[0].stored_bytes, kChunkHeaderBytes + payload.size());
  EXPECT_EQ(f.RoundTrip(std::move(outcomes[0].staged), 0), payload);
  EXPECT_EQ(f.pipeline->stats().fetched, 1u);
  EXPECT_EQ(f.tier->grants(), 0);  // a hit takes no lease
}

TEST(ChunkPipeline, AMissIsComputedUnderALeaseAndPublishedThroughTheCodec) {
  Fixture f;
  const Hash128 key = f.RandomKey();
  f.pipeline->Request({f.RequestFor(key)});
  auto outcomes = f.Await(1);
  ASSERT_EQ(outcomes.size(), 1u);
  EXPECT_FALSE(outcomes[0].fetched);
  EXPECT_EQ(outcomes[0].reason, ComputeReason::kMiss);
  EXPECT_TRUE(outcomes[0].publish);
  ASSERT_NE(outcomes[0].lease_id, 0u);

  // The "computed" KV: a payload imported into blocks 4 and 5, then captured.
  const std::string payload = f.RandomPayload();
  const std::vector<KvBlockRef> blocks{{4, 16, 0}, {5, kTokens - 16, 0}};
  ASSERT_TRUE(f.backend->ImportChunk(payload, blocks).ok());
  ASSERT_TRUE(f.pipeline->TryReservePublish(key, payload.size(), outcomes[0].lease_id));
  auto captured = f.backend->CaptureChunk(blocks);
  ASSERT_TRUE(captured.ok());
  f.pipeline->Publish(key, f.Layout(), outcomes[0].lease_id, *std::move(captured));
  f.pipeline->Flush();

  const auto published = f.tier->published();
  ASSERT_EQ(published.size(), 1u);
  EXPECT_EQ(published[0].lease_id, outcomes[0].lease_id);
  auto decoded = DecodeChunk(published[0].stored);  // checks the header and the payload checksum
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->header.key, key);
  EXPECT_EQ(decoded->header.model_fingerprint, f.fingerprint);
  EXPECT_EQ(decoded->header.layout, f.Layout());
  EXPECT_EQ(decoded->payload, payload);
  EXPECT_EQ(f.pipeline->stats().published, 1u);
  EXPECT_EQ(f.pipeline->stats().publish_bytes_in_flight, 0u);
  EXPECT_EQ(f.tier->outstanding_leases(), 0u);
}

TEST(ChunkPipeline, UnusableBytesAreRecomputedNeverImported) {
  for (int variant = 0; variant < 4; ++variant) {
    Fixture f(Always());
    const Hash128 key = f.RandomKey();
    const std::string payload = f.RandomPayload();
    switch (variant) {
      case 0:  // the tier reports corruption
        f.tier->Store(key, f.Stored(key, payload));
        f.tier->SetFaults({.corrupt = true});
        break;
      case 1:  // the tier hands back flipped bytes: the pipeline's checksum catches them
        f.tier->Store(key, f.Stored(key, payload));
        f.tier->SetFaults({.flip_bytes = true});
        break;
      case 2:  // another model's chunk under this key
        f.tier->Store(key, f.Stored(key, payload, Hash128{9, 9}));
        break;
      case 3:  // the connection dies mid-fetch
        f.tier->Store(key, f.Stored(key, payload));
        f.tier->SetFaults({.dies_in_fetch = true});
        break;
    }
    f.pipeline->Request({f.RequestFor(key)});
    auto outcomes = f.Await(1);
    ASSERT_EQ(outcomes.size(), 1u) << variant;
    EXPECT_FALSE(outcomes[0].fetched) << variant;
    EXPECT_EQ(outcomes[0].reason, ComputeReason::kFailed) << variant;
    EXPECT_FALSE(outcomes[0].publish) << variant;  // the tier holds the key: nothing to publish
    EXPECT_EQ(f.pipeline->stats().fetch_failures, 1u) << variant;
    EXPECT_EQ(f.pipeline->stats().computed_failed, 1u) << variant;
    // A checksum mismatch found here is reported (the tier judges its own copy); the other
    // failures are not the stored chunk's fault, or the tier found them itself.
    EXPECT_EQ(f.tier->reports(), variant == 1 ? std::vector<std::string>{"checksum"} : std::vector<std::string>{})
        << variant;
  }
}

TEST(ChunkPipeline, RecomputesWhenFetchingIsMeasuredSlower) {
  Fixture f;  // auto
  f.tier->SetFaults({.fetch_delay = milliseconds(150)});
  const Hash128 first = f.RandomKey(), second = f.RandomKey();
  f.tier->Store(first, f.Stored(first, f.RandomPayload()));
  f.tier->Store(second, f.Stored(second, f.RandomPayload()));
  // Steps: 512 prefill tokens cost 2 ms more than none, so 20 tokens cost ~0.08 ms.
  for (int i = 0; i < 8; ++i) {
    f.pipeline->RecordStep(StepShape{0}, 0.001);
    f.pipeline->RecordStep(StepShape{512}, 0.003);
  }
  f.pipeline->Request({f.RequestFor(first)});  // unmeasured source: fetched, which measures it
  auto outcomes = f.Await(1);
  ASSERT_EQ(outcomes.size(), 1u);
  EXPECT_TRUE(outcomes[0].fetched);
  f.pipeline->Request({f.RequestFor(second)});
  outcomes = f.Await(1);
  ASSERT_EQ(outcomes.size(), 1u);
  EXPECT_FALSE(outcomes[0].fetched);
  EXPECT_EQ(outcomes[0].reason, ComputeReason::kChosen);
  EXPECT_FALSE(outcomes[0].publish);
  EXPECT_EQ(outcomes[0].lease_id, 0u);
  EXPECT_EQ(f.tier->fetches(), 1);
  EXPECT_EQ(f.pipeline->stats().computed_chosen, 1u);
  EXPECT_EQ(f.pipeline->stats().computed_miss, 0u);
}

TEST(ChunkPipeline, FetchesWhenComputingIsMeasuredSlower) {
  Fixture f;  // auto
  const Hash128 first = f.RandomKey(), second = f.RandomKey();
  const std::string payload = f.RandomPayload();
  f.tier->Store(first, f.Stored(first, f.RandomPayload()));
  f.tier->Store(second, f.Stored(second, payload));
  for (int i = 0; i < 8; ++i) {  // 20 tokens cost about 4 s: anything fetches faster
    f.pipeline->RecordStep(StepShape{0}, 0.001);
    f.pipeline->RecordStep(StepShape{512}, 100.0);
  }
  for (const Hash128& key : {first, second}) {
    f.pipeline->Request({f.RequestFor(key)});
    auto outcomes = f.Await(1);
    ASSERT_EQ(outcomes.size(), 1u);
    ASSERT_TRUE(outcomes[0].fetched);
    if (key == second) {
      EXPECT_EQ(f.RoundTrip(std::move(outcomes[0].staged), 8), payload);
    }
  }
  EXPECT_EQ(f.pipeline->stats().computed_chosen, 0u);
}

// A burst of chunks from a source nobody has measured: one probe, and the rest wait for
// its answer (within what computing them would cost) instead of computing blindly.
TEST(ChunkPipeline, ABurstWaitsForTheProbeOfAnUnmeasuredSource) {
  for (const bool fast_source : {true, false}) {
    SCOPED_TRACE(fast_source ? "fast source, costly compute" : "slow source, cheap compute");
    Fixture f;  // auto
    f.tier->SetFaults({.fetch_delay = milliseconds(fast_source ? 20 : 400)});
    for (int i = 0; i < 8; ++i) {
      f.pipeline->RecordStep(StepShape{0}, 0.001);
      // Costly: 20 tokens cost seconds (the wait is capped at 1 s). Cheap: 20 tokens, 80 us.
      f.pipeline->RecordStep(StepShape{512}, fast_source ? 100.0 : 0.003);
    }
    std::vector<ChunkPipeline::ChunkRequest> burst;
    for (int i = 0; i < 6; ++i) {
      const Hash128 key = f.RandomKey();
      f.tier->Store(key, f.Stored(key, f.RandomPayload()));
      burst.push_back(f.RequestFor(key));
    }
    const auto start = std::chrono::steady_clock::now();
    f.pipeline->Request(burst);
    const auto outcomes = f.Await(burst.size());
    ASSERT_EQ(outcomes.size(), burst.size());
    if (fast_source && testing::SlowdownFactor() == 1) {
      // Woken by the probe's answer, not by the 1 s cap of the wait.
      EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(900));
    }
    int fetched = 0;
    for (const ChunkOutcome& o : outcomes) fetched += o.fetched;
    // Fast: every chunk fetched once the probe says so. Slow: only the probe.
    EXPECT_EQ(fetched, fast_source ? 6 : 1);
    EXPECT_EQ(f.pipeline->stats().computed_chosen, fast_source ? 0u : 5u);
  }
}

TEST(ChunkPipeline, NeverPolicyRecomputesEveryHit) {
  Fixture f(ChunkPipelineOptions{.fetch_policy = FetchPolicy::kNever});
  const Hash128 key = f.RandomKey();
  f.tier->Store(key, f.Stored(key, f.RandomPayload()));
  f.pipeline->Request({f.RequestFor(key)});
  auto outcomes = f.Await(1);
  ASSERT_EQ(outcomes.size(), 1u);
  EXPECT_EQ(outcomes[0].reason, ComputeReason::kChosen);
  EXPECT_EQ(f.tier->fetches(), 0);
}

TEST(ChunkPipeline, APublicationPastTheBudgetIsDroppedAndItsLeaseReleased) {
  Fixture f(ChunkPipelineOptions{.max_publish_bytes = 1000});
  const Hash128 key = f.RandomKey();
  f.pipeline->Request({f.RequestFor(key)});
  auto outcomes = f.Await(1);
  ASSERT_EQ(outcomes.size(), 1u);
  ASSERT_NE(outcomes[0].lease_id, 0u);
  ASSERT_GT(f.Layout().payload_bytes(), 1000u);
  EXPECT_FALSE(f.pipeline->TryReservePublish(key, f.Layout().payload_bytes(), outcomes[0].lease_id));
  f.pipeline->Flush();
  // The release is asynchronous: give it a moment.
  const auto give_up = Clock::now() + std::chrono::seconds(5);
  while (f.tier->outstanding_leases() > 0 && Clock::now() < give_up) std::this_thread::sleep_for(milliseconds(5));
  EXPECT_EQ(f.tier->outstanding_leases(), 0u);
  EXPECT_EQ(f.tier->released(), std::vector<uint64_t>{outcomes[0].lease_id});
  EXPECT_EQ(f.pipeline->stats().publications_dropped, 1u);
  EXPECT_TRUE(f.tier->published().empty());
}

TEST(ChunkPipeline, TheCallerNeverWaitsForASlowTier) {
  Fixture f(Always());
  f.tier->SetFaults({.lookup_delay = milliseconds(300),
                     .fetch_delay = milliseconds(300),
                     .lease_delay = milliseconds(300),
                     .publish_delay = milliseconds(300)});
  std::vector<Hash128> keys;
  for (int i = 0; i < 6; ++i) keys.push_back(f.RandomKey());
  f.tier->Store(keys[0], f.Stored(keys[0], f.RandomPayload()));
  const auto start = Clock::now();
  for (const Hash128& key : keys) f.pipeline->Request({f.RequestFor(key)});
  for (int i = 0; i < 20; ++i) (void)f.pipeline->Poll();
  const auto spent = Clock::now() - start;
  EXPECT_LT(spent, milliseconds(50) * testing::SlowdownFactor());
  const auto outcomes = f.Await(keys.size());
  EXPECT_EQ(outcomes.size(), keys.size());
}

TEST(ChunkPipeline, AFullQueueComputesWithoutAskingAndEveryChunkGetsOneOutcome) {
  Fixture f(ChunkPipelineOptions{.tier_threads = 1, .max_queued_tasks = 1});
  f.tier->SetFaults({.lookup_delay = milliseconds(100)});
  std::vector<Hash128> keys;
  for (int i = 0; i < 6; ++i) {
    keys.push_back(f.RandomKey());
    f.pipeline->Request({f.RequestFor(keys.back())});
  }
  const auto outcomes = f.Await(keys.size());
  ASSERT_EQ(outcomes.size(), keys.size());
  std::set<std::string> seen;
  for (const ChunkOutcome& o : outcomes) seen.insert(o.key.ToHex());
  EXPECT_EQ(seen.size(), keys.size());
  EXPECT_GE(f.pipeline->stats().computed_busy, 1u);
  EXPECT_EQ(f.pipeline->stats().computed_busy + f.pipeline->stats().computed_miss, keys.size());
}

TEST(ChunkPipeline, AWaiterFetchesTheHoldersPublication) {
  Fixture f(Always());
  const Hash128 key = f.RandomKey();
  const std::string payload = f.RandomPayload();
  f.tier->HoldForever(key, milliseconds(10000));
  std::thread holder([&] {
    std::this_thread::sleep_for(milliseconds(100));
    f.tier->Store(key, f.Stored(key, payload));
  });
  f.pipeline->Request({f.RequestFor(key)});
  auto outcomes = f.Await(1);
  holder.join();
  ASSERT_EQ(outcomes.size(), 1u);
  ASSERT_TRUE(outcomes[0].fetched);
  EXPECT_EQ(f.RoundTrip(std::move(outcomes[0].staged), 0), payload);
  EXPECT_EQ(f.pipeline->stats().lease_waits, 1u);
}

TEST(ChunkPipeline, AHungHolderCostsAtMostTheWaitBoundThenAComputationWithoutALease) {
  // No compute measured yet (a cold worker): the wait is its longest.
  Fixture f(ChunkPipelineOptions{.min_lease_wait = milliseconds(50), .max_lease_wait = milliseconds(300)});
  const Hash128 key = f.RandomKey();
  f.tier->HoldForever(key, milliseconds(10000));
  const auto start = Clock::now();
  f.pipeline->Request({f.RequestFor(key)});
  auto outcomes = f.Await(1);
  const auto waited = Clock::now() - start;
  ASSERT_EQ(outcomes.size(), 1u);
  EXPECT_FALSE(outcomes[0].fetched);
  EXPECT_EQ(outcomes[0].lease_id, 0u);
  EXPECT_FALSE(outcomes[0].publish);  // the holder still owns the key
  EXPECT_GE(waited, milliseconds(300));
  EXPECT_LT(waited, milliseconds(3000) * testing::SlowdownFactor());
}

TEST(ChunkPipeline, ASquattersLeaseCostsAWaitBoundedByTheChunksComputeTime) {
  Fixture f(ChunkPipelineOptions{.min_lease_wait = milliseconds(20), .max_lease_wait = milliseconds(30000)});
  // Measured: 10 ms per prefill token, so a 20-token chunk takes 200 ms to compute and a
  // waiter gives up after 3 x 200 ms, not after max_lease_wait.
  for (int i = 0; i < 8; ++i) f.pipeline->RecordStep(StepShape{i % 2 == 0 ? 10 : 30}, i % 2 == 0 ? 0.1 : 0.3);
  const Hash128 key = f.RandomKey();
  f.tier->HoldForever(key, milliseconds(120000));
  const auto start = Clock::now();
  f.pipeline->Request({f.RequestFor(key)});
  auto outcomes = f.Await(1);
  const auto waited = Clock::now() - start;
  ASSERT_EQ(outcomes.size(), 1u);
  EXPECT_FALSE(outcomes[0].fetched);
  EXPECT_FALSE(outcomes[0].publish);
  EXPECT_GE(waited, milliseconds(550));
  EXPECT_LT(waited, milliseconds(2000) * testing::SlowdownFactor());
}

TEST(ChunkPipeline, TheHoldersShortLeaseIsRenewedWhileItComputesAndDroppedWhenReleased) {
  const milliseconds ttl = milliseconds(300) * testing::SlowdownFactor();
  Fixture f(ChunkPipelineOptions{.min_lease_ttl = milliseconds(100), .lease_ttl = ttl});
  const Hash128 key = f.RandomKey();
  f.pipeline->Request({f.RequestFor(key)});
  auto outcomes = f.Await(1);
  ASSERT_EQ(outcomes.size(), 1u);
  ASSERT_NE(outcomes[0].lease_id, 0u);
  ASSERT_EQ(f.tier->granted_ttls().size(), 1u);
  EXPECT_EQ(f.tier->granted_ttls()[0], ttl);  // nothing measured: the longest
  // The engine computes for four TTLs: the lease must still be held.
  std::this_thread::sleep_for(4 * ttl);
  EXPECT_TRUE(f.tier->leased(key));
  EXPECT_GE(f.tier->renewals(), 3);
  EXPECT_EQ(f.pipeline->lease_keeper().held(), 1u);
  f.pipeline->ReleaseLease(key, outcomes[0].lease_id);
  EXPECT_EQ(f.pipeline->lease_keeper().held(), 0u);
  std::this_thread::sleep_for(ttl / 3);  // a renewal already under way lands
  const int renewals = f.tier->renewals();
  std::this_thread::sleep_for(ttl + ttl / 3);
  EXPECT_EQ(f.tier->renewals(), renewals);
  EXPECT_FALSE(f.tier->leased(key));
}

TEST(ChunkPipeline, ARefusedChunkIsReportedSoTheTierDropsIt) {
  const auto mac = std::make_shared<const ChunkMac>(std::string(32, 'k'));
  ChunkPipelineOptions options = Always();
  options.mac = mac;
  Fixture f(options);
  // A chunk holding a NaN, and one signed with another fleet's key.
  const Hash128 poisoned = f.RandomKey(), forged = f.RandomKey();
  std::string payload = f.RandomPayload();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(payload.data() + 4 * (f.rng() % (payload.size() / 4)), &nan, sizeof(nan));
  ChunkHeader header = MakeChunkHeader(poisoned, f.fingerprint, f.Layout(), payload);
  std::vector<std::string_view> pieces{payload};
  header.mac = mac->Sign(header, pieces);
  f.tier->Store(poisoned, EncodeChunk(header, payload));
  const std::string other = f.RandomPayload();
  ChunkHeader forged_header = MakeChunkHeader(forged, f.fingerprint, f.Layout(), other);
  std::vector<std::string_view> other_pieces{other};
  forged_header.mac = ChunkMac(std::string(32, 'x')).Sign(forged_header, other_pieces);
  f.tier->Store(forged, EncodeChunk(forged_header, other));

  f.pipeline->Request({f.RequestFor(poisoned), f.RequestFor(forged)});
  auto outcomes = f.Await(2);
  ASSERT_EQ(outcomes.size(), 2u);
  for (const ChunkOutcome& o : outcomes) EXPECT_FALSE(o.fetched);
  std::vector<std::string> reports = f.tier->reports();
  std::sort(reports.begin(), reports.end());
  EXPECT_EQ(reports, (std::vector<std::string>{"mac", "non_finite"}));
  EXPECT_FALSE(f.tier->stored(poisoned));
  EXPECT_FALSE(f.tier->stored(forged));
  EXPECT_EQ(f.pipeline->stats().chunks_rejected, 2u);
}

TEST(FetchCostModel, AnUnmeasuredSourceGetsOneProbeAtATime) {
  FetchCostModel model(FetchCostOptions{.decay = 0.9, .explore_every = 4});
  using Choice = FetchCostModel::Choice;
  // A burst before any measurement: one probe, the rest wait for it.
  EXPECT_EQ(model.Decide("disk", 64 << 20, 512), Choice::kExplore);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(model.Decide("disk", 64 << 20, 512), Choice::kAwaitProbe);
  EXPECT_EQ(model.Decide("host", 64 << 20, 512), Choice::kExplore);  // per source
  model.ProbeDone("host");
  EXPECT_EQ(model.Decide("host", 64 << 20, 512), Choice::kExplore);  // still unmeasured: probe again
  // The probe measured a slow disk (300 ms for 64 MiB) against 50 ms of compute.
  model.RecordFetch("disk", 64 << 20, 0.3);
  for (int i = 0; i < 8; ++i) model.RecordStep(StepShape{i % 2 == 0 ? 0 : 512}, i % 2 == 0 ? 0.01 : 0.06);
  int explores = 0, recomputes = 0;
  for (int i = 0; i < 8; ++i) {
    const Choice c = model.Decide("disk", 64 << 20, 512);
    explores += c == Choice::kExplore;
    recomputes += c == Choice::kRecompute;
    if (c == Choice::kExplore) model.ProbeDone("disk");
  }
  EXPECT_EQ(explores, 2);  // one in explore_every, to keep measuring
  EXPECT_EQ(recomputes, 6);
  // A fast source (2 ms) wins against the same compute.
  model.RecordFetch("host", 64 << 20, 0.002);
  EXPECT_EQ(model.Decide("host", 64 << 20, 512), Choice::kFetch);
}

TEST(DecayingLinearFit, RecoversALineAndFallsBackThroughTheOrigin) {
  std::mt19937_64 rng(testing::FreshSeed());
  const double a = 0.002 + (rng() % 100) * 1e-5, b = 1e-9 * (1 + rng() % 50);
  DecayingLinearFit fit(0.95);
  EXPECT_FALSE(fit.Predict(1).has_value());
  for (int i = 0; i < 200; ++i) {
    const double x = static_cast<double>(rng() % (64 << 20));
    fit.Add(x, a + b * x);
  }
  EXPECT_NEAR(fit.intercept(), a, a * 1e-6);
  EXPECT_NEAR(fit.slope(), b, b * 1e-6);
  DecayingLinearFit constant(0.9);
  for (int i = 0; i < 5; ++i) constant.Add(1000, 0.5);
  EXPECT_NEAR(*constant.Predict(2000), 1.0, 1e-9);  // x never varied: proportional
}

}  // namespace
}  // namespace lazykv
