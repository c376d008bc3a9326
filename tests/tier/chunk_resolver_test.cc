// ChunkResolver over a fake tier that can be slow, hung, full or corrupt: what it decides
// (fetch, compute under a lease, compute without one), what it publishes, and that a
// misbehaving tier costs a computation, never a wrong chunk or a stuck caller.
#include "worker/tier/chunk_resolver.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "tests/fake_chunk_tier.h"

namespace lazykv {
namespace {

using std::chrono::milliseconds;
using testing::FakeChunkTier;

const Hash128 kKey{0x1234, 0x5678};
const Hash128 kFingerprint{1, 2};

struct Fixture {
  explicit Fixture(ResolverOptions options = {}) {
    auto owned = std::make_unique<FakeChunkTier>();
    tier = owned.get();
    resolver = std::make_unique<ChunkResolver>(std::move(owned), options);
  }
  FakeChunkTier* tier;
  std::unique_ptr<ChunkResolver> resolver;
};

std::optional<TierHit> HintFor(ChunkResolver& resolver, const Hash128& key) {
  return resolver.Lookup(std::span(&key, 1))[0];
}

TEST(ChunkResolver, FetchesAStoredChunk) {
  Fixture f;
  f.tier->Store(kKey, "chunk bytes");
  const auto hint = HintFor(*f.resolver, kKey);
  ASSERT_TRUE(hint.has_value());
  const ChunkResolver::Decision d = f.resolver->Resolve(kKey, hint);
  ASSERT_TRUE(d.fetched.has_value());
  EXPECT_EQ(d.fetched->stored.ToString(), "chunk bytes");
  EXPECT_EQ(f.resolver->stats().fetched, 1u);
  EXPECT_EQ(f.resolver->stats().computed, 0u);
}

TEST(ChunkResolver, AMissIsComputedUnderALeaseAndPublishedInTheBackground) {
  Fixture f;
  const ChunkResolver::Decision d = f.resolver->Resolve(kKey, HintFor(*f.resolver, kKey));
  EXPECT_FALSE(d.fetched.has_value());
  EXPECT_NE(d.lease_id, 0u);
  f.resolver->PublishAsync(kKey, kFingerprint, "computed", d.lease_id);
  f.resolver->Flush();
  const auto published = f.tier->published();
  ASSERT_EQ(published.size(), 1u);
  EXPECT_EQ(published[0].stored, "computed");
  EXPECT_EQ(published[0].lease_id, d.lease_id);
  EXPECT_EQ(f.resolver->stats().published, 1u);
  // The next resolution fetches what was published.
  const ChunkResolver::Decision again = f.resolver->Resolve(kKey, HintFor(*f.resolver, kKey));
  ASSERT_TRUE(again.fetched.has_value());
  EXPECT_EQ(again.fetched->stored.ToString(), "computed");
}

TEST(ChunkResolver, ACorruptChunkIsComputedAndNotPublished) {
  Fixture f;
  f.tier->Store(kKey, "stored");
  f.tier->SetFaults({.corrupt = true});
  const ChunkResolver::Decision d = f.resolver->Resolve(kKey, HintFor(*f.resolver, kKey));
  EXPECT_FALSE(d.fetched.has_value());
  EXPECT_EQ(d.lease_id, 0u);  // stored but unreadable: no lease, so nothing is published over it
  EXPECT_EQ(f.resolver->stats().fetch_failures, 2u);  // the hinted fetch and the one after kStored
  EXPECT_EQ(f.resolver->stats().computed, 1u);
}

TEST(ChunkResolver, AFullTierRefusesThePublicationAndTheLeaseIsReleased) {
  Fixture f;
  f.tier->SetFaults({.full = true});
  const ChunkResolver::Decision d = f.resolver->Resolve(kKey, std::nullopt);
  ASSERT_NE(d.lease_id, 0u);
  f.resolver->PublishAsync(kKey, kFingerprint, "computed", d.lease_id);
  f.resolver->Flush();
  EXPECT_EQ(f.resolver->stats().publish_failures, 1u);
  EXPECT_EQ(f.tier->released(), std::vector<uint64_t>{d.lease_id});  // a waiter may compute it now
}

TEST(ChunkResolver, ASlowTierNeverBlocksThePublisher) {
  Fixture f;
  f.tier->SetFaults({.publish_delay = milliseconds(300)});
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 3; ++i) f.resolver->PublishAsync(Hash128{1, uint64_t(i)}, kFingerprint, "x", 0);
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(200));
  f.resolver->Flush();
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(900));
  EXPECT_EQ(f.tier->published().size(), 3u);
}

TEST(ChunkResolver, AWaiterFetchesTheHoldersPublication) {
  Fixture f;
  f.tier->HoldForever(kKey, milliseconds(10000));
  std::thread holder([&] {
    std::this_thread::sleep_for(milliseconds(100));
    f.tier->Store(kKey, "from the holder");
  });
  const ChunkResolver::Decision d = f.resolver->Resolve(kKey, std::nullopt);
  holder.join();
  ASSERT_TRUE(d.fetched.has_value());
  EXPECT_EQ(d.fetched->stored.ToString(), "from the holder");
  EXPECT_EQ(f.resolver->stats().lease_waits, 1u);
  EXPECT_EQ(f.resolver->stats().computed, 0u);
}

TEST(ChunkResolver, AHungHolderCostsAtMostMaxWaitThenAComputationWithoutALease) {
  Fixture f(ResolverOptions{.lease_ttl = milliseconds(10000), .max_wait = milliseconds(300)});
  f.tier->HoldForever(kKey, milliseconds(10000));
  const auto start = std::chrono::steady_clock::now();
  const ChunkResolver::Decision d = f.resolver->Resolve(kKey, std::nullopt);
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_FALSE(d.fetched.has_value());
  EXPECT_EQ(d.lease_id, 0u);  // the holder still owns the key: ours is not published
  EXPECT_GE(waited, milliseconds(300));
  EXPECT_LT(waited, milliseconds(3000));
  EXPECT_EQ(f.resolver->stats().computed, 1u);
}

TEST(ChunkResolver, ManyConcurrentResolversComputeAChunkOnce) {
  Fixture f;
  constexpr int kThreads = 8;
  std::atomic<int> computed{0}, fetched{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      const ChunkResolver::Decision d = f.resolver->Resolve(kKey, HintFor(*f.resolver, kKey));
      if (d.fetched) {
        EXPECT_EQ(d.fetched->stored.ToString(), "once");
        ++fetched;
        return;
      }
      ++computed;
      std::this_thread::sleep_for(milliseconds(50));  // the computation
      f.resolver->PublishAsync(kKey, kFingerprint, "once", d.lease_id);
    });
  }
  for (std::thread& t : threads) t.join();
  f.resolver->Flush();
  EXPECT_EQ(computed.load(), 1);
  EXPECT_EQ(fetched.load(), kThreads - 1);
  EXPECT_EQ(f.tier->grants(), 1);
}

}  // namespace
}  // namespace lazykv
