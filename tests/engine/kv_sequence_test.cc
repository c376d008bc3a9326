// KvSequence: the block table it builds (deltas, token counts, own tail) and the
// references it holds and gives back on every path.
#include "worker/engine/kv_sequence.h"

#include <gtest/gtest.h>

#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

namespace lazykv {
namespace {

void LogToStderr() { spdlog::set_default_logger(spdlog::stderr_color_st("death-test")); }

TEST(KvSequence, AdoptedBlocksCarryTheGivenDeltaAndOwnBlocksDeltaZero) {
  KvBlockAllocator allocator(8);
  KvSequence seq(&allocator);
  const int32_t a = *allocator.Allocate(), b = *allocator.Allocate(), own = *allocator.Allocate();
  seq.AdoptBlocks(std::vector<KvBlockRef>{{a, 16, 99}, {b, 3, 99}}, 40);
  EXPECT_FALSE(seq.TailHasRoom(16));  // a chunk's partial last block is never written to
  seq.AdoptEmptyOwnBlock(own);
  ASSERT_TRUE(seq.TailHasRoom(4));
  for (int i = 0; i < 4; ++i) seq.FillTailSlot();
  EXPECT_FALSE(seq.TailHasRoom(4));
  const std::vector<KvBlockRef> expected = {{a, 16, 40}, {b, 3, 40}, {own, 4, 0}};
  ASSERT_EQ(seq.table().size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(seq.table()[i].block, expected[i].block);
    EXPECT_EQ(seq.table()[i].num_tokens, expected[i].num_tokens);
    EXPECT_EQ(seq.table()[i].delta, expected[i].delta);
  }
  EXPECT_EQ(seq.num_held(), 3u);
}

TEST(KvSequence, SharedBlocksKeepTheOwnersReferenceAndAllGoBackOnDestruction) {
  KvBlockAllocator allocator(4);
  const int32_t cached = *allocator.Allocate();  // held by someone else (the cache index)
  {
    KvSequence seq(&allocator);
    seq.ShareBlocks(std::vector<KvBlockRef>{{cached, 16, 0}});
    seq.AdoptEmptyOwnBlock(*allocator.Allocate());
    EXPECT_EQ(allocator.refcount(cached), 2);
    EXPECT_EQ(allocator.num_free(), 2);
  }
  EXPECT_EQ(allocator.refcount(cached), 1);
  EXPECT_EQ(allocator.num_free(), 3);
}

TEST(KvSequence, ClearEmptiesTheTableAndAllowsReuse) {
  KvBlockAllocator allocator(2);
  KvSequence seq(&allocator);
  seq.AdoptEmptyOwnBlock(*allocator.Allocate());
  seq.FillTailSlot();
  seq.Clear();
  EXPECT_TRUE(seq.table().empty());
  EXPECT_EQ(allocator.num_free(), 2);
  EXPECT_FALSE(seq.TailHasRoom(16));
}

TEST(KvSequence, SpareBlocksEnterTheTableInOrderAndUnusedOnesGoBack) {
  KvBlockAllocator allocator(8);
  {
    KvSequence seq(&allocator);
    const int32_t first = *allocator.AllocateRun(4);
    seq.AdoptEmptyOwnBlock(first);
    seq.FillTailSlot();
    const std::vector<int32_t> spares = {first + 1, first + 2, first + 3};
    seq.HoldSpareOwnBlocks(spares);
    EXPECT_EQ(seq.num_spare_own_blocks(), 3u);
    EXPECT_EQ(seq.num_held(), 1u);  // spares are not in the table yet
    EXPECT_TRUE(seq.TailHasRoom(2));
    seq.FillTailSlot();
    seq.AdoptSpareOwnBlock();
    seq.FillTailSlot();
    seq.AdoptSpareOwnBlock();
    ASSERT_EQ(seq.table().size(), 3u);
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(seq.table()[i].block, first + i);
      EXPECT_EQ(seq.table()[i].delta, 0);
    }
    EXPECT_EQ(seq.table()[1].num_tokens, 1);
    EXPECT_EQ(seq.table()[2].num_tokens, 0);
    EXPECT_TRUE(seq.TailHasRoom(2));  // an adopted spare is an own tail block
    EXPECT_EQ(seq.num_spare_own_blocks(), 1u);
    EXPECT_EQ(allocator.num_free(), 4);
  }
  EXPECT_EQ(allocator.num_free(), 8);  // the table's blocks and the spare left unused
}

TEST(KvSequenceDeathTest, FillingASlotWithoutAnOwnTailAborts) {
  LogToStderr();  // the abort's message is what the death test reads
  KvBlockAllocator allocator(2);
  KvSequence seq(&allocator);
  EXPECT_DEATH(seq.FillTailSlot(), "no own tail block");
  seq.AdoptBlocks(std::vector<KvBlockRef>{{*allocator.Allocate(), 2, 0}}, 0);
  EXPECT_DEATH(seq.FillTailSlot(), "no own tail block");
}

}  // namespace
}  // namespace lazykv
