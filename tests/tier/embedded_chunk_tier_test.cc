// The embedded tier's zero-copy paths: a chunk published into the store's own pages and
// fetched back as those pages, byte for byte; what an abandoned, corrupt or oversized
// publication leaves behind (nothing); and a fetched chunk outliving its eviction.
#include "worker/tier/embedded_chunk_tier.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include "tests/cache_server/cache_test_util.h"
#include "tests/test_util.h"

namespace lazykv::testing {
namespace {

std::unique_ptr<EmbeddedChunkTier> OpenTier(const std::string& dir, uint64_t host_bytes) {
  cache::TieredStoreOptions options;
  options.host_capacity_bytes = host_bytes;
  options.page_bytes = 64 << 10;
  options.disk_capacity_bytes = 0;  // host RAM only: what is evicted is gone
  options.data_dir = dir;
  options.pin_host_memory = false;
  options.space_wait = std::chrono::milliseconds(50);
  auto tier = EmbeddedChunkTier::Open(options);
  EXPECT_TRUE(tier.ok()) << tier.status();
  return *std::move(tier);
}

// Writes `stored` into a slot's pieces.
void Fill(PublishSlot& slot, const std::string& stored) { WriteToPieces(slot.Pieces(), 0, stored); }

TEST(EmbeddedChunkTierTest, PublishedInPlaceAndFetchedAsTheStorePages) {
  std::mt19937_64 rng(FreshSeed());
  const std::string dir = TempDir("embedded_zero_copy");
  auto tier = OpenTier(dir, 8 << 20);
  const TestChunk chunk = RandomTestChunk(rng, 300000 + rng() % 200000);  // several 64 KiB pages
  const std::string stored = chunk.stored();
  auto slot = tier->BeginPublish(chunk.key, chunk.fingerprint, stored.size(), 0);
  ASSERT_TRUE(slot.ok()) << slot.status();
  EXPECT_GT((*slot)->Pieces().size(), 1u);
  Fill(**slot, stored);
  ASSERT_TRUE((*slot)->Commit().ok());
  auto fetched = tier->Fetch(chunk.key);
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_EQ(fetched->source, ChunkSource::kHost);
  EXPECT_TRUE(fetched->payload_verified);
  EXPECT_TRUE(fetched->stored.ToString() == stored);
  // The pieces are the pages the slot wrote: the same addresses, not a copy.
  std::set<const char*> written;
  for (std::span<char> piece : (*slot)->Pieces()) written.insert(piece.data());
  ASSERT_EQ(fetched->stored.pieces().size(), (*slot)->Pieces().size());
  for (std::string_view piece : fetched->stored.pieces()) EXPECT_TRUE(written.contains(piece.data()));
  std::filesystem::remove_all(dir);
}

TEST(EmbeddedChunkTierTest, AFetchedChunkOutlivesItsDeletion) {
  std::mt19937_64 rng(FreshSeed());
  const std::string dir = TempDir("embedded_outlive");
  auto tier = OpenTier(dir, 4 << 20);
  const TestChunk chunk = RandomTestChunk(rng, 200000);
  ASSERT_TRUE(tier->Publish(chunk.key, chunk.fingerprint, chunk.stored(), 0).ok());
  auto fetched = tier->Fetch(chunk.key);
  ASSERT_TRUE(fetched.ok());
  EXPECT_TRUE(tier->store().Delete(chunk.key));
  // Fill the host tier with others: the deleted chunk's pages must not be reused while held.
  for (int i = 0; i < 30; ++i) {
    const TestChunk other = RandomTestChunk(rng, 200000);
    (void)tier->Publish(other.key, other.fingerprint, other.stored(), 0);
  }
  EXPECT_TRUE(fetched->stored.ToString() == chunk.stored());
  EXPECT_FALSE(tier->Lookup(std::span(&chunk.key, 1))[0].has_value());
  std::filesystem::remove_all(dir);
}

TEST(EmbeddedChunkTierTest, AbandonedCorruptAndOversizedPublicationsLeaveNothing) {
  std::mt19937_64 rng(FreshSeed());
  const std::string dir = TempDir("embedded_bad_publish");
  auto tier = OpenTier(dir, 2 << 20);
  const uint64_t used_before = tier->store().stats().host_used;
  const TestChunk chunk = RandomTestChunk(rng, 150000);
  std::string stored = chunk.stored();
  {
    auto slot = tier->BeginPublish(chunk.key, chunk.fingerprint, stored.size(), 0);
    ASSERT_TRUE(slot.ok());
    Fill(**slot, stored);
  }  // never committed
  EXPECT_EQ(tier->store().stats().host_used, used_before);
  EXPECT_FALSE(tier->Lookup(std::span(&chunk.key, 1))[0].has_value());
  stored[stored.size() / 2] ^= 0x40;  // one payload bit
  auto slot = tier->BeginPublish(chunk.key, chunk.fingerprint, stored.size(), 0);
  ASSERT_TRUE(slot.ok());
  Fill(**slot, stored);
  EXPECT_EQ((*slot)->Commit().code(), absl::StatusCode::kDataLoss);
  slot->reset();
  EXPECT_FALSE(tier->Lookup(std::span(&chunk.key, 1))[0].has_value());
  EXPECT_EQ(tier->store().stats().host_used, used_before);
  // Larger than the whole host tier: refused, not waited for.
  auto huge = tier->BeginPublish(chunk.key, chunk.fingerprint, 3 << 20, 0);
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace lazykv::testing
