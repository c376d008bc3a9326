// RemoteChunkTier against a real lazykv-cache-server process: deadlines from observed
// latency, a hung (SIGSTOPped) server costing one short deadline (calls under way to it
// are cancelled) and then nothing until the prober finds it back, and a refusal (RESOURCE_EXHAUSTED) that is a miss,
// neither retried nor marking the server down. ServerEstimator's arithmetic on its own.
#include "worker/tier/remote_chunk_tier.h"

#include <signal.h>

#include <filesystem>
#include <future>
#include <thread>

#include "gtest/gtest.h"
#include "tests/cache_server/cache_test_util.h"
#include "tests/test_util.h"

namespace lazykv::testing {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

std::unique_ptr<RemoteChunkTier> MakeTier(const std::string& address) {
  // The default deadlines, scaled for slow builds (sanitizers).
  auto tier = RemoteChunkTier::Create(RemoteTierOptions{.servers = {address},
                                                        .holder = "test",
                                                        .initial_call_deadline = milliseconds(100 * SlowdownFactor()),
                                                        .min_call_deadline = milliseconds(20 * SlowdownFactor())});
  EXPECT_TRUE(tier.ok()) << tier.status();
  return *std::move(tier);
}

TEST(ServerEstimatorTest, DeadlinesFollowObservedLatencyBetweenFloorAndCeiling) {
  ServerEstimator e(DeadlinePolicy{.initial_call = milliseconds(100),
                                   .min_call = milliseconds(20),
                                   .max_call = milliseconds(2000),
                                   .max_transfer = milliseconds(60000)});
  EXPECT_EQ(e.CallDeadline(), milliseconds(100)) << "no sample yet";
  for (int i = 0; i < 20; ++i) e.ObserveCall(milliseconds(1));
  EXPECT_EQ(e.CallDeadline(), milliseconds(20)) << "a fast server: the floor";
  EXPECT_NEAR(e.latency_ms(), 1.0, 0.01);
  // A server that slows to 50 ms: the deadline follows, above the new latency.
  for (int i = 0; i < 40; ++i) e.ObserveCall(milliseconds(50));
  EXPECT_GT(e.CallDeadline(), milliseconds(50));
  EXPECT_LT(e.CallDeadline(), milliseconds(80));
  // Jittery latency widens the deadline beyond the mean.
  ServerEstimator jitter(DeadlinePolicy{});
  for (int i = 0; i < 40; ++i) jitter.ObserveCall(milliseconds(i % 2 == 0 ? 10 : 50));
  EXPECT_GT(jitter.CallDeadline(), milliseconds(60));
  // Never past the ceiling.
  for (int i = 0; i < 40; ++i) e.ObserveCall(milliseconds(5000));
  EXPECT_EQ(e.CallDeadline(), milliseconds(2000));
}

TEST(ServerEstimatorTest, TransferDeadlinesScaleWithSizeAndBandwidth) {
  ServerEstimator e(DeadlinePolicy{});
  for (int i = 0; i < 20; ++i) e.ObserveCall(milliseconds(1));
  // Assumed 100 MB/s before any transfer: 4 x 10 ms for 1 MB, on top of the call deadline.
  EXPECT_EQ(e.TransferDeadline(1000000), milliseconds(20 + 40));
  e.ObserveTransfer(1000000, milliseconds(1));  // 1 GB/s
  EXPECT_EQ(e.TransferDeadline(1000000), milliseconds(20 + 4));
  EXPECT_NEAR(e.bandwidth_bytes_per_s(), 1e9, 1e3);
  EXPECT_GT(e.TransferDeadline(100000000), e.TransferDeadline(1000000));
  EXPECT_EQ(e.TransferDeadline(0), e.TransferDeadline(1000000)) << "a get is sized by the largest chunk seen";
  EXPECT_EQ(e.TransferDeadline(uint64_t{1} << 50), milliseconds(60000)) << "capped";
}

TEST(RemoteChunkTierTest, HungServerIsSkippedFastAndComesBackAfterResume) {
  const int slow = SlowdownFactor();
  std::mt19937_64 rng(FreshSeed());
  const std::string dir = TempDir("remote_tier_hung");
  auto server = StartCacheServer(dir);
  ASSERT_TRUE(server->started()) << server->first_line();
  auto tier = MakeTier(server->address());
  const TestChunk chunk = RandomTestChunk(rng, 64 << 10);
  ASSERT_TRUE(tier->Publish(chunk.key, chunk.fingerprint, chunk.stored(), 0).ok());
  const Hash128 keys[] = {chunk.key};
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(tier->Lookup(keys)[0].has_value()) << i;
  {
    const auto estimates = tier->Estimates();
    ASSERT_EQ(estimates.size(), 1u);
    EXPECT_EQ(estimates[0].address, server->address());
    EXPECT_TRUE(estimates[0].up);
    EXPECT_GT(estimates[0].latency_ms, 0);
    EXPECT_GT(estimates[0].bandwidth_bytes_per_s, 0);
    std::printf("estimate before the pause: %.3f ms, %.0f MB/s\n", estimates[0].latency_ms,
                estimates[0].bandwidth_bytes_per_s / 1e6);
  }

  // A lease wait under way when the server hangs (another holder has the lease).
  const Hash128 held{rng(), rng()};
  ASSERT_EQ(tier->Lease(held, milliseconds(20000), milliseconds(0)).state, LeaseAnswer::State::kGranted);
  auto waiter = std::async(std::launch::async, [&] {
    const LeaseAnswer answer = tier->Lease(held, milliseconds(20000), milliseconds(10000));
    return std::make_pair(answer.state, Clock::now());
  });
  std::this_thread::sleep_for(milliseconds(100));

  server->Signal(SIGSTOP);
  // The first lookup waits one short deadline (tens of ms), not seconds.
  auto start = Clock::now();
  EXPECT_FALSE(tier->Lookup(keys)[0].has_value());
  const double first_ms = MsSince(start);
  std::printf("first lookup of the hung server: %.1f ms\n", first_ms);
  EXPECT_LT(first_ms, 300.0 * slow);
  EXPECT_FALSE(tier->Estimates()[0].up);
  // Marking it down ended the lease wait too, instead of its 10 s.
  const auto [waited_state, waited_end] = waiter.get();
  EXPECT_EQ(waited_state, LeaseAnswer::State::kUnavailable);
  const double waiter_ms = std::chrono::duration<double, std::milli>(waited_end - start).count();
  std::printf("lease wait under way ended %.1f ms after the pause\n", waiter_ms);
  EXPECT_LT(waiter_ms, 300.0 * slow);
  // Then its keys are misses with no call at all.
  start = Clock::now();
  for (int i = 0; i < 100; ++i) {
    EXPECT_FALSE(tier->Lookup(keys)[0].has_value());
    EXPECT_EQ(tier->Fetch(chunk.key).status().code(), absl::StatusCode::kUnavailable);
    EXPECT_EQ(tier->Lease(chunk.key, milliseconds(1000), milliseconds(0)).state, LeaseAnswer::State::kUnavailable);
  }
  const double later_ms = MsSince(start);
  std::printf("100 x (lookup, fetch, lease) while down: %.2f ms\n", later_ms);
  EXPECT_LT(later_ms, 20.0 * slow) << "calls to a down server must not touch the network";
  // Still hung after several probe intervals: still down.
  std::this_thread::sleep_for(milliseconds(600));
  EXPECT_FALSE(tier->Estimates()[0].up);
  EXPECT_FALSE(tier->Lookup(keys)[0].has_value());

  server->Signal(SIGCONT);
  start = Clock::now();
  while (!tier->Estimates()[0].up && MsSince(start) < 3000.0 * slow) std::this_thread::sleep_for(milliseconds(5));
  const double back_ms = MsSince(start);
  std::printf("marked up %.0f ms after SIGCONT\n", back_ms);
  EXPECT_TRUE(tier->Estimates()[0].up);
  EXPECT_LT(back_ms, 1000.0 * slow);
  EXPECT_TRUE(tier->Lookup(keys)[0].has_value()) << "hits again once back";
  auto fetched = tier->Fetch(chunk.key);
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_EQ(fetched->stored.size(), chunk.stored().size());
  tier.reset();
  server.reset();
  std::filesystem::remove_all(dir);
}

TEST(RemoteChunkTierTest, DestructorCancelsAHealthCheckOfAHungServer) {
  const int slow = SlowdownFactor();
  std::mt19937_64 rng(FreshSeed());
  const std::string dir = TempDir("remote_tier_destroy");
  auto server = StartCacheServer(dir);
  ASSERT_TRUE(server->started()) << server->first_line();
  // Probes of a down server get at least the first-call deadline: 2 s here.
  auto tier = *RemoteChunkTier::Create(RemoteTierOptions{.servers = {server->address()},
                                                         .holder = "test",
                                                         .initial_call_deadline = milliseconds(2000),
                                                         .min_call_deadline = milliseconds(20 * slow)});
  const Hash128 keys[] = {Hash128{rng(), rng()}};
  for (int i = 0; i < 10; ++i) tier->Lookup(keys);
  server->Signal(SIGSTOP);
  tier->Lookup(keys);
  ASSERT_FALSE(tier->Estimates()[0].up);
  std::this_thread::sleep_for(milliseconds(400));  // a probe is under way
  const auto start = Clock::now();
  tier.reset();
  const double destroy_ms = MsSince(start);
  std::printf("destroyed in %.1f ms during a health check of a hung server\n", destroy_ms);
  EXPECT_LT(destroy_ms, 500.0 * slow);
  server->Signal(SIGCONT);
  server.reset();
  std::filesystem::remove_all(dir);
}

TEST(RemoteChunkTierTest, RefusedChunkIsAMissNotRetriedAndTheServerStaysUp) {
  std::mt19937_64 rng(FreshSeed());
  const std::string dir = TempDir("remote_tier_refused");
  auto server = StartCacheServer(dir, {"--max-chunk-bytes", "256KiB", "--metrics-listen", "127.0.0.1:0"});
  ASSERT_TRUE(server->started()) << server->first_line();
  auto tier = MakeTier(server->address());
  const TestChunk small = RandomTestChunk(rng, 64 << 10);
  const TestChunk large = RandomTestChunk(rng, 1 << 20);
  ASSERT_TRUE(tier->Publish(small.key, small.fingerprint, small.stored(), 0).ok());
  const absl::Status refused = tier->Publish(large.key, large.fingerprint, large.stored(), 0);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  // Sent once: the server counted one refusal.
  const std::string page = HttpGet(server->metrics_address(), "/metrics");
  EXPECT_NE(page.find("lazykv_cache_rejected_total{reason=\"chunk_too_large\"} 1\n"), std::string::npos) << page;
  // Not down: the next lookup reaches the server and hits.
  EXPECT_TRUE(tier->Estimates()[0].up);
  const Hash128 keys[] = {small.key, large.key};
  const auto hits = tier->Lookup(keys);
  EXPECT_TRUE(hits[0].has_value());
  EXPECT_FALSE(hits[1].has_value());
  EXPECT_TRUE(tier->Fetch(small.key).ok());
  tier.reset();
  server.reset();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace lazykv::testing
