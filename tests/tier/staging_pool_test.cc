// The receive buffers of peer link fetches (worker/tier/staging_pool.h), in host memory: a
// buffer given back is reused for a request it fits; what is handed out never passes the
// bound (RESOURCE_EXHAUSTED, and nothing changes); kept buffers make room for a new one
// when the bound needs it. References: counts written out by hand.
#include "worker/tier/staging_pool.h"

#include <cstring>

#include "gtest/gtest.h"

namespace lazykv::testing {
namespace {

constexpr uint64_t kMiB = 1 << 20;

TEST(StagingPoolTest, ReusesBuffersAndKeepsToItsBound) {
  std::shared_ptr<StagingPool> pool = StagingPool::Create(/*device=*/-1, 16 * kMiB);
  auto a = pool->Acquire(5 * kMiB);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ((*a)->size(), 6 * kMiB) << "rounded up to 2 MiB";
  EXPECT_GT((*a)->allocation_seconds(), 0.0) << "allocated: a one-time cost, reported";
  std::memset((*a)->data(), 7, 5 * kMiB);  // writable, all of it
  char* const first = (*a)->data();
  EXPECT_EQ(pool->outstanding_bytes(), 6 * kMiB);
  a->reset();
  EXPECT_EQ(pool->outstanding_bytes(), 0u);
  EXPECT_EQ(pool->kept_bytes(), 6 * kMiB);
  auto b = pool->Acquire(3 * kMiB);  // fits the kept one: reused
  ASSERT_TRUE(b.ok());
  EXPECT_EQ((*b)->data(), first);
  EXPECT_EQ((*b)->allocation_seconds(), 0.0) << "kept: nothing allocated";
  EXPECT_EQ(pool->kept_bytes(), 0u);
  auto c = pool->Acquire(10 * kMiB);
  ASSERT_TRUE(c.ok());
  auto d = pool->Acquire(2 * kMiB);  // 6 + 10 handed out: no room for 2 more
  EXPECT_EQ(d.status().code(), absl::StatusCode::kResourceExhausted) << d.status();
  EXPECT_EQ(pool->outstanding_bytes(), 16 * kMiB);
  b->reset();
  c->reset();
  EXPECT_EQ(pool->kept_bytes(), 16 * kMiB);
  // 12 MiB fits neither kept buffer: both go to make room for a new one.
  auto e = pool->Acquire(12 * kMiB);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(pool->outstanding_bytes(), 12 * kMiB);
  EXPECT_LE(pool->outstanding_bytes() + pool->kept_bytes(), 16 * kMiB);
  EXPECT_EQ(pool->Acquire(17 * kMiB).status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(StagingPoolTest, BuffersOutliveThePool) {
  std::shared_ptr<StagingPool> pool = StagingPool::Create(-1, 8 * kMiB);
  const std::weak_ptr<StagingPool> watch = pool;
  auto a = pool->Acquire(kMiB);
  ASSERT_TRUE(a.ok());
  pool.reset();
  EXPECT_FALSE(watch.expired()) << "the buffer holds its pool";
  std::memset((*a)->data(), 1, kMiB);
  a->reset();
  EXPECT_TRUE(watch.expired()) << "the last buffer let its pool go";
}

}  // namespace
}  // namespace lazykv::testing
