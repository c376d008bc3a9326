// KvCacheIndex against a plain LRU list: references taken and given back, least recently
// used eviction that skips entries a sequence still holds, and entries gone after eviction.
#include "worker/engine/kv_cache_index.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <list>
#include <random>

#include "tests/test_util.h"

namespace lazykv {
namespace {

Hash128 Key(uint64_t n) { return Hash128{n, n * 31 + 7}; }

// Allocates `n` blocks of `tokens` each and hands them to the index, keeping no reference.
std::vector<KvBlockRef> InsertFresh(KvBlockAllocator& allocator, KvCacheIndex& index, const Hash128& key, int n,
                                    int tokens = 16) {
  std::vector<KvBlockRef> blocks;
  for (int i = 0; i < n; ++i) blocks.push_back(KvBlockRef{*allocator.Allocate(), tokens, 0});
  index.Insert(key, blocks);
  for (const KvBlockRef& ref : blocks) allocator.Unref(ref.block);  // the index's reference remains
  return blocks;
}

TEST(KvCacheIndex, InsertTakesOneReferencePerBlockAndLookupFindsTheEntry) {
  KvBlockAllocator allocator(8);
  KvCacheIndex index(&allocator);
  std::vector<KvBlockRef> blocks = {{*allocator.Allocate(), 16, 0}, {*allocator.Allocate(), 5, 0}};
  index.Insert(Key(1), blocks);
  for (const KvBlockRef& ref : blocks) EXPECT_EQ(allocator.refcount(ref.block), 2);
  const CachedKv* entry = index.Lookup(Key(1));
  ASSERT_NE(entry, nullptr);
  EXPECT_EQ(entry->num_tokens, 21);
  EXPECT_EQ(entry->blocks.size(), 2u);
  EXPECT_EQ(index.num_blocks(), 2u);
  EXPECT_EQ(index.Lookup(Key(2)), nullptr);
  // A second insert under the same key changes nothing and takes no reference.
  index.Insert(Key(1), {KvBlockRef{blocks[0].block, 16, 0}});
  EXPECT_EQ(allocator.refcount(blocks[0].block), 2);
  EXPECT_EQ(index.Lookup(Key(1))->num_tokens, 21);
}

TEST(KvCacheIndex, EvictsLeastRecentlyUsedFirstAndLookupRefreshes) {
  KvBlockAllocator allocator(6);
  KvCacheIndex index(&allocator);
  for (uint64_t k = 1; k <= 3; ++k) InsertFresh(allocator, index, Key(k), 2);
  ASSERT_EQ(allocator.num_free(), 0);
  ASSERT_NE(index.Lookup(Key(1)), nullptr);  // 1 is now the most recent; 2 the oldest
  ASSERT_TRUE(index.EvictUntilFree(2));
  EXPECT_FALSE(index.Contains(Key(2)));
  EXPECT_TRUE(index.Contains(Key(1)));
  EXPECT_TRUE(index.Contains(Key(3)));
  EXPECT_EQ(index.Lookup(Key(2)), nullptr);  // gone: its next use recomputes it
  EXPECT_EQ(index.evictions(), 1u);
  ASSERT_TRUE(index.EvictUntilFree(4));
  EXPECT_FALSE(index.Contains(Key(3)));
  EXPECT_TRUE(index.Contains(Key(1)));
}

TEST(KvCacheIndex, NeverEvictsAnEntryASequenceHolds) {
  KvBlockAllocator allocator(4);
  KvCacheIndex index(&allocator);
  const auto held = InsertFresh(allocator, index, Key(1), 2);
  InsertFresh(allocator, index, Key(2), 2);
  allocator.Ref(held[1].block);  // a running sequence shares one block of entry 1
  EXPECT_FALSE(index.EvictUntilFree(4));
  EXPECT_TRUE(index.Contains(Key(1)));
  EXPECT_FALSE(index.Contains(Key(2)));
  EXPECT_EQ(allocator.num_free(), 2);
  allocator.Unref(held[1].block);
  EXPECT_TRUE(index.EvictUntilFree(4));
  EXPECT_EQ(index.size(), 0u);
}

TEST(KvCacheIndex, DestructionGivesEveryReferenceBack) {
  KvBlockAllocator allocator(5);
  {
    KvCacheIndex index(&allocator);
    InsertFresh(allocator, index, Key(1), 3);
    InsertFresh(allocator, index, Key(2), 2);
    EXPECT_EQ(allocator.num_free(), 0);
  }
  EXPECT_EQ(allocator.num_free(), 5);
}

TEST(KvCacheIndex, MatchesAPlainLruUnderRandomUse) {
  const uint64_t seed = testing::FreshSeed();
  SCOPED_TRACE(seed);
  std::mt19937_64 rng(seed);
  constexpr int kBlocks = 24;
  KvBlockAllocator allocator(kBlocks);
  KvCacheIndex index(&allocator);
  struct Model {
    uint64_t key;
    int blocks;
  };
  std::list<Model> lru;  // front: most recent
  for (int step = 0; step < 3000; ++step) {
    const uint64_t key = rng() % 12;
    const int blocks = 1 + static_cast<int>(key % 3);
    auto found = std::find_if(lru.begin(), lru.end(), [&](const Model& m) { return m.key == key; });
    if (rng() % 2 == 0) {
      ASSERT_EQ(index.Lookup(Key(key)) != nullptr, found != lru.end());
      if (found != lru.end()) lru.splice(lru.begin(), lru, found);
      continue;
    }
    if (found != lru.end()) continue;
    // Make room as the engine does, then insert; the model evicts from its back.
    const bool room = index.EvictUntilFree(blocks);
    int free = kBlocks;
    for (const Model& m : lru) free -= m.blocks;
    while (free < blocks && !lru.empty()) {
      free += lru.back().blocks;
      lru.pop_back();
    }
    ASSERT_TRUE(room);
    InsertFresh(allocator, index, Key(key), blocks);
    lru.push_front(Model{key, blocks});
    ASSERT_EQ(index.size(), lru.size());
    for (const Model& m : lru) ASSERT_TRUE(index.Contains(Key(m.key))) << "key " << m.key;
  }
}

}  // namespace
}  // namespace lazykv
