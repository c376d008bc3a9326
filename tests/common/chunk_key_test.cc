// Chunk keys: stable across processes and builds, sensitive to every input.
#include "common/chunk_key.h"

#include <random>

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace lazykv {
namespace {

TEST(ChunkKeyTest, StableAcrossProcesses) {
  // Pinned value: a change here changes every stored key (bump kChunkFormatVersion instead).
  // Computed independently: the field bytes (u64 little-endian lengths and values) laid
  // out by a script and hashed with `xxhsum -H2` (XXH3-128, canonical high/low hex).
  const Hash128 fingerprint = MakeModelFingerprint(Hash128{1, 2}, "fp32");
  EXPECT_EQ(fingerprint.ToHex(), "fdab91a811eab8acb432bda9dbe85ac0");
  const std::vector<int32_t> anchor = {1}, doc = {10, 20, 30};
  EXPECT_EQ(MakeChunkKey(fingerprint, anchor, doc).ToHex(), MakeChunkKey(fingerprint, anchor, doc).ToHex());
  EXPECT_EQ(MakeChunkKey(fingerprint, anchor, doc).ToHex(), "d2b126ab4f34200aae87b29a9b7ff902");
}

TEST(ChunkKeyTest, EveryInputChangesTheKey) {
  std::mt19937_64 rng(testing::FreshSeed());
  const auto doc = testing::RandomTokens(rng, 50, 1000);
  const std::vector<int32_t> anchor = {1};
  const Hash128 fp = MakeModelFingerprint(Hash128{rng(), rng()}, "fp32");
  const ChunkKey key = MakeChunkKey(fp, anchor, doc);
  auto changed = doc;
  changed[17] += 1;
  EXPECT_NE(MakeChunkKey(fp, anchor, changed), key);
  EXPECT_NE(MakeChunkKey(MakeModelFingerprint(Hash128{1, 1}, "fp32"), anchor, doc), key);
  EXPECT_NE(MakeChunkKey(MakeModelFingerprint(Hash128{1, 1}, "fp32"), anchor, doc),
            MakeChunkKey(MakeModelFingerprint(Hash128{1, 1}, "bf16"), anchor, doc));
  EXPECT_NE(MakeChunkKey(fp, std::vector<int32_t>{1, 2}, doc), key);
  // The boundary between anchor and chunk is part of the key.
  std::vector<int32_t> moved_anchor = {1, doc[0]};
  EXPECT_NE(MakeChunkKey(fp, moved_anchor, std::span(doc).subspan(1)), key);
  EXPECT_NE(MakeAnchorKey(fp, anchor), MakeChunkKey(fp, {}, anchor));
}

TEST(ChunkKeyTest, HexRoundTrips) {
  const Hash128 h{0x0123456789abcdefULL, 0xfedcba9876543210ULL};
  auto parsed = Hash128::FromHex(h.ToHex());
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(*parsed, h);
  EXPECT_FALSE(Hash128::FromHex("xyz").ok());
  EXPECT_FALSE(Hash128::FromHex(std::string(32, 'g')).ok());
}

}  // namespace
}  // namespace lazykv
