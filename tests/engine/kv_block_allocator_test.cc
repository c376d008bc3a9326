// KvBlockAllocator against a plain refcount map: random allocate/ref/unref sequences,
// LIFO reuse, exhaustion, and the aborts on a free block.
#include "worker/engine/kv_block_allocator.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"
#include "tests/test_util.h"

namespace lazykv {
namespace {

void LogToStderr() { spdlog::set_default_logger(spdlog::stderr_color_st("death-test")); }

TEST(KvBlockAllocator, HandsOutEveryBlockOnceThenNothing) {
  KvBlockAllocator allocator(7);
  std::set<int32_t> seen;
  for (int i = 0; i < 7; ++i) {
    auto block = allocator.Allocate();
    ASSERT_TRUE(block.has_value());
    EXPECT_TRUE(seen.insert(*block).second) << "block " << *block << " handed out twice";
    EXPECT_EQ(allocator.refcount(*block), 1);
  }
  EXPECT_EQ(seen, (std::set<int32_t>{0, 1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(allocator.num_free(), 0);
  EXPECT_FALSE(allocator.Allocate().has_value());
}

TEST(KvBlockAllocator, ReusesTheMostRecentlyFreedBlockFirst) {
  KvBlockAllocator allocator(4);
  const int32_t a = *allocator.Allocate(), b = *allocator.Allocate();
  allocator.Unref(a);
  allocator.Unref(b);
  EXPECT_EQ(*allocator.Allocate(), b);
  EXPECT_EQ(*allocator.Allocate(), a);
}

TEST(KvBlockAllocator, FreesABlockOnlyWithItsLastReference) {
  KvBlockAllocator allocator(2);
  const int32_t block = *allocator.Allocate();
  allocator.Ref(block);
  allocator.Ref(block);
  EXPECT_EQ(allocator.refcount(block), 3);
  allocator.Unref(block);
  allocator.Unref(block);
  EXPECT_EQ(allocator.num_free(), 1);
  allocator.Unref(block);
  EXPECT_EQ(allocator.num_free(), 2);
  EXPECT_EQ(allocator.refcount(block), 0);
}

TEST(KvBlockAllocator, MatchesARefcountMapUnderRandomOperations) {
  const uint64_t seed = testing::FreshSeed();
  SCOPED_TRACE(seed);
  std::mt19937_64 rng(seed);
  constexpr int kBlocks = 32;
  KvBlockAllocator allocator(kBlocks);
  std::map<int32_t, int> model;  // held block -> references
  for (int step = 0; step < 5000; ++step) {
    const int op = static_cast<int>(rng() % 3);
    if (op == 0 || model.empty()) {
      auto block = allocator.Allocate();
      ASSERT_EQ(block.has_value(), static_cast<int>(model.size()) < kBlocks);
      if (block) {
        ASSERT_FALSE(model.contains(*block));
        model[*block] = 1;
      }
      continue;
    }
    auto it = std::next(model.begin(), static_cast<long>(rng() % model.size()));
    if (op == 1) {
      allocator.Ref(it->first);
      ++it->second;
    } else {
      allocator.Unref(it->first);
      if (--it->second == 0) model.erase(it);
    }
    ASSERT_EQ(allocator.num_free(), kBlocks - static_cast<int>(model.size()));
  }
  for (int32_t b = 0; b < kBlocks; ++b) {
    EXPECT_EQ(allocator.refcount(b), model.contains(b) ? model[b] : 0) << "block " << b;
  }
}

TEST(KvBlockAllocatorDeathTest, RefOrUnrefOfAFreeBlockAborts) {
  LogToStderr();  // the abort's message is what the death test reads
  KvBlockAllocator allocator(2);
  const int32_t block = *allocator.Allocate();
  allocator.Unref(block);
  EXPECT_DEATH(allocator.Ref(block), "referenced while free");
  EXPECT_DEATH(allocator.Unref(block), "released more often than taken");
}

}  // namespace
}  // namespace lazykv
