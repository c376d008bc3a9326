// KvBlockAllocator against a plain refcount map: random allocate/run/ref/unref sequences
// (each block and run the lowest free, found by a plain scan of the map), exhaustion, and the
// aborts on a free block.
#include "worker/engine/kv_block_allocator.h"

#include <gtest/gtest.h>

#include <map>
#include <optional>
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

TEST(KvBlockAllocator, HandsOutTheLowestFreeBlockAndRun) {
  KvBlockAllocator allocator(70);  // a partial last word of the bitmap
  for (int i = 0; i < 70; ++i) ASSERT_EQ(*allocator.Allocate(), i);
  for (const int32_t b : {3, 5, 6, 7, 64, 65, 66, 67, 69}) allocator.Unref(b);
  EXPECT_EQ(*allocator.AllocateRun(3), 5);   // 3 alone is too short
  EXPECT_EQ(*allocator.AllocateRun(4), 64);  // 64..67, in the bitmap's second word
  EXPECT_FALSE(allocator.AllocateRun(2).has_value()) << "3 and 69 are free, not adjacent";
  EXPECT_EQ(allocator.num_free(), 2);
  EXPECT_EQ(*allocator.Allocate(), 3);
  EXPECT_EQ(*allocator.AllocateRun(1), 69);
  EXPECT_FALSE(allocator.Allocate().has_value());
  EXPECT_EQ(allocator.peak_allocated(), 70);
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
  constexpr int kBlocks = 150;  // three words of the bitmap, the last partial
  KvBlockAllocator allocator(kBlocks);
  std::map<int32_t, int> model;  // held block -> references
  // The lowest b with [b, b + count) all free in the model, or -1.
  const auto lowest_run = [&](int count) {
    for (int32_t b = 0; b + count <= kBlocks; ++b) {
      bool free = true;
      for (int32_t i = b; i < b + count && free; ++i) free = !model.contains(i);
      if (free) return b;
    }
    return -1;
  };
  for (int step = 0; step < 20000; ++step) {
    const int op = static_cast<int>(rng() % 6);  // unrefs (3-5) outnumber refs: the pool fills and drains
    if (op <= 1 || model.empty()) {
      const int count = op == 0 ? 1 : 1 + static_cast<int>(rng() % 12);
      const int32_t expected = lowest_run(count);
      const std::optional<int32_t> first = count == 1 ? allocator.Allocate() : allocator.AllocateRun(count);
      ASSERT_EQ(first.value_or(-1), expected) << "run of " << count << " at step " << step;
      for (int32_t i = expected; first && i < expected + count; ++i) model[i] = 1;
      continue;
    }
    auto it = std::next(model.begin(), static_cast<long>(rng() % model.size()));
    if (op == 2) {
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
