// LeaseKeeper against the fake tier: a kept lease outlives many TTLs, a forgotten one
// lapses, a lease the tier no longer holds is dropped, and a lease never published nor
// released is given up after max_hold.
#include "worker/tier/lease_keeper.h"

#include <gtest/gtest.h>

#include <thread>

#include "tests/fake_chunk_tier.h"
#include "tests/test_util.h"

namespace lazykv {
namespace {

using std::chrono::milliseconds;
using testing::FakeChunkTier;

// Times scaled for slow runs (ThreadSanitizer): renewals come every third of a TTL.
milliseconds Scaled(int ms) { return milliseconds(ms) * testing::SlowdownFactor(); }

LeaseAnswer Grant(FakeChunkTier& tier, const Hash128& key, milliseconds ttl) {
  LeaseAnswer answer = tier.Lease(key, ttl, milliseconds(0));
  EXPECT_EQ(answer.state, LeaseAnswer::State::kGranted);
  return answer;
}

TEST(LeaseKeeperTest, KeepsALeaseAcrossManyTtlsUntilForgotten) {
  FakeChunkTier tier;
  LeaseKeeper keeper(&tier, std::chrono::seconds(60));
  const Hash128 a{testing::FreshSeed(), 1}, b{testing::FreshSeed(), 2};
  const LeaseAnswer la = Grant(tier, a, Scaled(300));
  const LeaseAnswer lb = Grant(tier, b, Scaled(300));
  keeper.Keep(a, la.lease_id, Scaled(300));
  std::this_thread::sleep_for(Scaled(1000));
  EXPECT_TRUE(tier.leased(a));
  EXPECT_FALSE(tier.leased(b));  // not kept: lapsed after its TTL
  // Another caller cannot take the kept lease.
  EXPECT_EQ(tier.Lease(a, Scaled(150), milliseconds(0)).state, LeaseAnswer::State::kHeld);
  EXPECT_GE(keeper.stats().renewals, 3u);
  keeper.Forget(a, lb.lease_id);  // another lease's id: no effect
  EXPECT_EQ(keeper.held(), 1u);
  keeper.Forget(a, la.lease_id);
  EXPECT_EQ(keeper.held(), 0u);
  std::this_thread::sleep_for(Scaled(500));
  EXPECT_FALSE(tier.leased(a));
  EXPECT_EQ(tier.Lease(a, Scaled(150), milliseconds(0)).state, LeaseAnswer::State::kGranted);
}

TEST(LeaseKeeperTest, DropsALeaseTheTierNoLongerHolds) {
  FakeChunkTier tier;
  LeaseKeeper keeper(&tier, std::chrono::seconds(60));
  const Hash128 key{testing::FreshSeed(), 3};
  const LeaseAnswer lease = Grant(tier, key, Scaled(120));
  keeper.Keep(key, lease.lease_id, Scaled(120));
  tier.ReleaseLease(key, lease.lease_id);  // taken away (an operator, a restart)
  std::this_thread::sleep_for(Scaled(300));
  EXPECT_EQ(keeper.held(), 0u);
  EXPECT_EQ(keeper.stats().lost, 1u);
}

TEST(LeaseKeeperTest, GivesUpALeaseHeldPastMaxHold) {
  FakeChunkTier tier;
  LeaseKeeper keeper(&tier, Scaled(400));
  const Hash128 key{testing::FreshSeed(), 4};
  const LeaseAnswer lease = Grant(tier, key, Scaled(150));
  keeper.Keep(key, lease.lease_id, Scaled(150));
  std::this_thread::sleep_for(Scaled(300));
  EXPECT_TRUE(tier.leased(key));
  std::this_thread::sleep_for(Scaled(500));
  EXPECT_EQ(keeper.held(), 0u);
  EXPECT_EQ(keeper.stats().abandoned, 1u);
  EXPECT_FALSE(tier.leased(key));
}

}  // namespace
}  // namespace lazykv
