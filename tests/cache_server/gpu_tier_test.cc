// GpuTier over the emulated device arena (the same logic as on a GPU, pages in host
// memory): a promoted chunk reads back byte for byte with its header kept apart; when full
// the tier evicts, and a victim no lower tier holds is demoted with its exact bytes; a value
// a reader holds keeps its pages after eviction (nothing overwrites them); promotions
// requested from readers run on the promoter thread; Delete; a chunk larger than the tier;
// the arena gives a chunk one run of adjacent pages whenever one is free, and its Pieces
// merge adjacent pages.
// References: the random bytes each chunk was made of, and the arena's free-page count.
#include "cache_server/gpu_tier.h"

#include <gtest/gtest.h>

#include <random>
#include <unordered_map>
#include <unordered_set>

#include "tests/test_util.h"

namespace lazykv::cache {
namespace {

constexpr uint64_t kPage = 4096;

std::string RandomBytes(std::mt19937_64& rng, size_t n) {
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

class GpuTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = testing::FreshSeed();
    rng_.seed(seed_);
  }
  std::unique_ptr<GpuTier> Make(uint64_t pages, std::function<bool(const Hash128&)> stored_below = nullptr) {
    GpuTierOptions options{.capacity_bytes = pages * kPage, .page_bytes = kPage, .emulate = true,
                           .eviction_policy = "lru"};
    auto tier = GpuTier::Create(
        options, metrics_, std::move(stored_below),
        [this](const Hash128& key, std::string bytes) { demoted_[key] = std::move(bytes); });
    EXPECT_TRUE(tier.ok()) << tier.status();
    return *std::move(tier);
  }
  // A stored chunk's stand-in of `bytes` random bytes (the tier does not parse it).
  std::pair<Hash128, std::string> Chunk(size_t bytes) {
    return {Hash128{rng_(), rng_()}, RandomBytes(rng_, bytes)};
  }
  static ChunkReader Reader(const std::string& bytes) { return ChunkReader(StoreTier::kHost, bytes); }

  uint64_t seed_ = 0;
  std::mt19937_64 rng_;
  std::shared_ptr<CacheMetrics> metrics_ = std::make_shared<CacheMetrics>();
  std::unordered_map<Hash128, std::string, Hash128Hasher> demoted_;
};

// References: page sets written out by hand.
TEST(DeviceArenaTest, AllocatesOneRunOfAdjacentPagesWheneverOneIsFree) {
  auto arena = *DeviceArena::CreateEmulated(16 * kPage, kPage);
  std::vector<uint32_t> a, b, c, d, e, f;
  ASSERT_TRUE(arena->TryAllocate(4, &a));
  ASSERT_TRUE(arena->TryAllocate(4, &b));
  ASSERT_TRUE(arena->TryAllocate(4, &c));
  ASSERT_TRUE(arena->TryAllocate(4, &d));
  EXPECT_EQ(b, (std::vector<uint32_t>{4, 5, 6, 7}));
  EXPECT_FALSE(arena->TryAllocate(1, &e)) << "full";
  arena->Free(a);  // free: 0-3
  arena->Free(c);  // free: 0-3, 8-11
  ASSERT_TRUE(arena->TryAllocate(3, &e));
  EXPECT_EQ(e, (std::vector<uint32_t>{0, 1, 2})) << "the first run that fits";
  ASSERT_TRUE(arena->TryAllocate(4, &f));
  EXPECT_EQ(f, (std::vector<uint32_t>{8, 9, 10, 11})) << "a run, not page 3 and the next three";
  arena->Free(f);
  arena->Free(d);  // free: 3, 8-15
  std::vector<uint32_t> g;
  ASSERT_TRUE(arena->TryAllocate(8, &g));
  EXPECT_EQ(g, (std::vector<uint32_t>{8, 9, 10, 11, 12, 13, 14, 15})) << "pages freed apart, adjacent again";
  arena->Free(g);
  arena->Free(e);  // free: 0-3, 8-15
  std::vector<uint32_t> h;
  ASSERT_TRUE(arena->TryAllocate(10, &h));  // no run of 10: the lowest free pages
  EXPECT_EQ(h, (std::vector<uint32_t>{0, 1, 2, 3, 8, 9, 10, 11, 12, 13}));
  EXPECT_EQ(arena->free_pages(), 2u);
  // Adjacent pages are one piece.
  const std::vector<std::string_view> pieces = *arena->Pieces(h, 100, 10 * kPage - 200);
  ASSERT_EQ(pieces.size(), 2u);
  EXPECT_EQ(pieces[0].data(), arena->base() + 100);
  EXPECT_EQ(pieces[0].size(), 4 * kPage - 100);
  EXPECT_EQ(pieces[1].data(), arena->base() + 8 * kPage);
  EXPECT_EQ(pieces[1].size(), 6 * kPage - 100);
}

TEST_F(GpuTierTest, APromotedChunkReadsBackExactlyWithItsHeader) {
  SCOPED_TRACE(seed_);
  auto tier = Make(16);
  for (int i = 0; i < 4; ++i) {
    const auto [key, bytes] = Chunk(std::uniform_int_distribution<size_t>(kChunkHeaderBytes, 3 * kPage + 17)(rng_));
    ASSERT_TRUE(tier->Promote(key, Reader(bytes)).ok());
    auto value = tier->Find(key);
    ASSERT_NE(value, nullptr);
    EXPECT_EQ(value->size(), bytes.size());
    EXPECT_EQ(value->header(), bytes.substr(0, kChunkHeaderBytes));
    EXPECT_EQ(value->pages().size(), (bytes.size() + kPage - 1) / kPage);
    // A fresh arena hands out ascending runs: a reader copies the chunk in one piece.
    for (size_t p = 1; p < value->pages().size(); ++p) EXPECT_EQ(value->pages()[p], value->pages()[p - 1] + 1);
    auto back = value->ReadAll();
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, bytes) << "chunk " << i;
  }
  EXPECT_EQ(tier->stats().promotions, 4u);

  EXPECT_EQ(metrics_->gpu_promotions->Value(), 4);
  EXPECT_FALSE(tier->Contains(Hash128{1, 2}));
}

TEST_F(GpuTierTest, WhenFullItEvictsAndDemotesOnlyTheChunksNoLowerTierHolds) {
  SCOPED_TRACE(seed_);
  std::unordered_set<Hash128, Hash128Hasher> below;  // what host RAM or disk still holds
  auto tier = Make(4, [&](const Hash128& key) { return below.contains(key); });
  const auto a = Chunk(2 * kPage), b = Chunk(2 * kPage), c = Chunk(2 * kPage), d = Chunk(2 * kPage);
  below.insert(a.first);  // a is still in host RAM: dropped; b is not: demoted
  ASSERT_TRUE(tier->Promote(a.first, Reader(a.second)).ok());
  ASSERT_TRUE(tier->Promote(b.first, Reader(b.second)).ok());
  ASSERT_TRUE(tier->Promote(c.first, Reader(c.second)).ok());  // evicts a (least recent)
  EXPECT_FALSE(tier->Contains(a.first));
  EXPECT_TRUE(demoted_.empty()) << "a was held below: nothing to demote";
  ASSERT_NE(tier->Find(b.first), nullptr);                     // b read: c is now the least recent
  ASSERT_TRUE(tier->Promote(d.first, Reader(d.second)).ok());  // evicts c
  EXPECT_FALSE(tier->Contains(c.first));
  ASSERT_EQ(demoted_.count(c.first), 1u);
  EXPECT_EQ(demoted_[c.first], c.second) << "a demoted chunk must keep its exact bytes";
  const GpuTierStats s = tier->stats();
  EXPECT_EQ(s.evictions, 2u);
  EXPECT_EQ(s.demotions, 1u);
  EXPECT_EQ(s.entries, 2u);
  EXPECT_EQ(s.used, 4 * kPage);
}

TEST_F(GpuTierTest, AValueAReaderHoldsKeepsItsPagesAfterEviction) {
  SCOPED_TRACE(seed_);
  auto tier = Make(4);
  const auto a = Chunk(2 * kPage), b = Chunk(2 * kPage), c = Chunk(2 * kPage);
  ASSERT_TRUE(tier->Promote(a.first, Reader(a.second)).ok());
  std::shared_ptr<const GpuValue> leased = tier->Find(a.first);  // a worker's read lease
  ASSERT_TRUE(tier->Promote(b.first, Reader(b.second)).ok());
  // c needs room: a leaves the index first, but its pages stay with the reader, so b goes
  // too and c takes b's pages.
  ASSERT_TRUE(tier->Promote(c.first, Reader(c.second)).ok());
  EXPECT_FALSE(tier->Contains(a.first));
  EXPECT_FALSE(tier->Contains(b.first));
  EXPECT_EQ(*leased->ReadAll(), a.second) << "a leased value's pages were reused";
  EXPECT_EQ(*tier->Find(c.first)->ReadAll(), c.second);
  EXPECT_EQ(tier->arena().free_pages(), 0u);
  leased.reset();  // the lease ends: the pages go back
  EXPECT_EQ(tier->arena().free_pages(), 2u);
  // With every page held by readers, a promotion finds no room and says so.
  std::shared_ptr<const GpuValue> held = tier->Find(c.first);
  ASSERT_TRUE(tier->Promote(a.first, Reader(a.second)).ok());  // a takes the 2 free pages
  std::shared_ptr<const GpuValue> held_a = tier->Find(a.first);
  EXPECT_EQ(tier->Promote(b.first, Reader(b.second)).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(*held->ReadAll(), c.second);
  EXPECT_EQ(*held_a->ReadAll(), a.second);
}

TEST_F(GpuTierTest, RequestedPromotionsRunOnThePromoterDeleteAndTooLarge) {
  SCOPED_TRACE(seed_);
  auto tier = Make(8);
  std::vector<std::pair<Hash128, std::string>> chunks;
  for (int i = 0; i < 3; ++i) chunks.push_back(Chunk(kPage + 1));
  for (const auto& [key, bytes] : chunks) tier->RequestPromotion(key, Reader(bytes));
  tier->RequestPromotion(chunks[0].first, Reader(chunks[0].second));  // queued or held already: once
  tier->WaitForPromotions();
  for (const auto& [key, bytes] : chunks) {
    ASSERT_TRUE(tier->Contains(key));
    EXPECT_EQ(*tier->Find(key)->ReadAll(), bytes);
  }
  EXPECT_EQ(tier->stats().promotions, 3u);
  // A Delete right after a requested promotion leaves nothing, whenever the promotion runs
  // (queued: unqueued; just taken off the queue, or under way: it ends without storing; done:
  // deleted). Many rounds: the promoter's moment between the queue and the copy is short.
  for (int i = 0; i < 500; ++i) {
    const auto gone = Chunk(kPage + 1);
    tier->RequestPromotion(gone.first, Reader(gone.second));
    tier->Delete(gone.first);
    tier->WaitForPromotions();
    EXPECT_FALSE(tier->Contains(gone.first)) << "a deleted chunk came back, round " << i;
  }
  EXPECT_TRUE(tier->Delete(chunks[1].first));
  EXPECT_FALSE(tier->Delete(chunks[1].first));
  EXPECT_FALSE(tier->Contains(chunks[1].first));
  EXPECT_EQ(tier->arena().free_pages(), 8u - 4u);
  const auto huge = Chunk(9 * kPage);
  EXPECT_EQ(tier->Promote(huge.first, Reader(huge.second)).code(), absl::StatusCode::kResourceExhausted);
  tier->RequestPromotion(huge.first, Reader(huge.second));  // ignored, not queued
  tier->WaitForPromotions();
  EXPECT_FALSE(tier->Contains(huge.first));
}

TEST_F(GpuTierTest, WithoutAGpuTheRealArenaIsRefusedClearly) {
  if (DeviceArena::CreateOnGpu(kPage, kPage, 0).ok()) GTEST_SKIP() << "a GPU is present";
  GpuTierOptions options{.capacity_bytes = 4 * kPage, .page_bytes = kPage};
  auto tier = GpuTier::Create(options, metrics_, nullptr, nullptr);
  EXPECT_EQ(tier.status().code(), absl::StatusCode::kFailedPrecondition) << tier.status();
}

}  // namespace
}  // namespace lazykv::cache
