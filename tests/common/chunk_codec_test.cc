// The chunk codec: round trips, and every malformed or corrupt chunk is refused with a
// precise status. Also rendezvous ownership and byte-size parsing (common/).
#include "common/chunk_codec.h"

#include <random>

#include "common/byte_size.h"
#include "common/rendezvous_hash.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace lazykv {
namespace {

struct Sample {
  ChunkHeader header;
  std::string payload;
};

Sample RandomChunk(std::mt19937_64& rng) {
  ChunkLayout layout{.num_layers = static_cast<uint32_t>(1 + rng() % 4),
                     .n_kv_heads = static_cast<uint32_t>(1 + rng() % 4),
                     .head_dim = 8,
                     .num_tokens = static_cast<uint32_t>(1 + rng() % 40),
                     .anchor_tokens = 1,
                     .dtype = rng() % 2 ? KvDtype::kFp32 : KvDtype::kBf16};
  std::string payload(layout.payload_bytes(), '\0');
  for (char& c : payload) c = static_cast<char>(rng());
  const ChunkHeader header = MakeChunkHeader(Hash128{rng(), rng()}, Hash128{rng(), rng()}, layout, payload);
  return {header, payload};
}

TEST(ChunkCodecTest, RoundTrip) {
  std::mt19937_64 rng(testing::FreshSeed());
  for (int trial = 0; trial < 20; ++trial) {
    const Sample s = RandomChunk(rng);
    const std::string stored = EncodeChunk(s.header, s.payload);
    ASSERT_EQ(stored.size(), kChunkHeaderBytes + s.payload.size());
    auto view = DecodeChunk(stored);
    ASSERT_TRUE(view.ok()) << view.status();
    EXPECT_EQ(view->payload, s.payload);
    EXPECT_EQ(view->header.key, s.header.key);
    EXPECT_EQ(view->header.model_fingerprint, s.header.model_fingerprint);
    EXPECT_EQ(view->header.layout, s.header.layout);
    EXPECT_EQ(view->header.payload_checksum, s.header.payload_checksum);
  }
}

TEST(ChunkCodecTest, LayoutOffsetsTileThePayload) {
  const ChunkLayout layout{.num_layers = 3, .n_kv_heads = 2, .head_dim = 4, .num_tokens = 5, .dtype = KvDtype::kBf16};
  EXPECT_EQ(layout.row_bytes(), 2u * 4 * 2);
  EXPECT_EQ(layout.plane_bytes(), 5u * 16);
  EXPECT_EQ(layout.plane_offset(0, 1), layout.plane_bytes());
  EXPECT_EQ(layout.plane_offset(2, 1) + layout.plane_bytes(), layout.payload_bytes());
}

TEST(ChunkCodecTest, StreamingChecksumMatchesOneShot) {
  std::mt19937_64 rng(testing::FreshSeed());
  const Sample s = RandomChunk(rng);
  PayloadChecksummer streaming;
  for (size_t pos = 0; pos < s.payload.size();) {
    const size_t n = std::min<size_t>(1 + rng() % 97, s.payload.size() - pos);
    streaming.Update(std::string_view(s.payload).substr(pos, n));
    pos += n;
  }
  EXPECT_EQ(streaming.Finish(), ChunkPayloadChecksum(s.payload));
}

TEST(ChunkCodecTest, CorruptPayloadIsDataLoss) {
  std::mt19937_64 rng(testing::FreshSeed());
  const Sample s = RandomChunk(rng);
  std::string stored = EncodeChunk(s.header, s.payload);
  stored[kChunkHeaderBytes + rng() % s.payload.size()] ^= 0x10;
  EXPECT_EQ(DecodeChunk(stored).status().code(), absl::StatusCode::kDataLoss);
}

TEST(ChunkCodecTest, WrongLengthsAreInvalid) {
  std::mt19937_64 rng(testing::FreshSeed());
  const Sample s = RandomChunk(rng);
  const std::string stored = EncodeChunk(s.header, s.payload);
  auto shorter = DecodeChunk(std::string_view(stored).substr(0, stored.size() - 1));
  EXPECT_EQ(shorter.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(shorter.status().message().find("payload_bytes"), std::string::npos) << shorter.status();
  EXPECT_EQ(DecodeChunk(stored + "x").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeChunk(stored.substr(0, 50)).status().code(), absl::StatusCode::kInvalidArgument);
  // A header whose payload size disagrees with its own layout.
  ChunkHeader lying = s.header;
  lying.payload_bytes += 2;
  auto bad = DecodeChunkHeader(EncodeChunkHeader(lying));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ChunkCodecTest, ALayoutTooLargeFor64BitSizesIsRefused) {
  // Found by fuzzing: 2^31 of every dimension wraps the payload size to 0 in 64 bits, and a
  // header claiming it decoded with an empty payload.
  ChunkLayout huge{.num_layers = 1u << 31, .n_kv_heads = 1u << 31, .head_dim = 1u << 31, .num_tokens = 1u << 31,
                   .anchor_tokens = 1, .dtype = KvDtype::kBf16};
  ChunkHeader header = MakeChunkHeader(Hash128{1, 2}, Hash128{3, 4}, huge, "");
  header.payload_bytes = huge.payload_bytes();  // what the wrapped arithmetic says
  auto decoded = DecodeChunkHeader(EncodeChunkHeader(header));
  EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument) << decoded.status();
  EXPECT_NE(decoded.status().message().find("too large"), std::string::npos) << decoded.status();
  EXPECT_FALSE(DecodeChunk(EncodeChunkHeader(header)).ok());
}

TEST(ChunkCodecTest, WrongVersionMagicOrHeaderChecksum) {
  std::mt19937_64 rng(testing::FreshSeed());
  const Sample s = RandomChunk(rng);
  ChunkHeader future = s.header;
  future.layout_version = kChunkFormatVersion + 1;
  auto version = DecodeChunk(EncodeChunk(future, s.payload));
  EXPECT_EQ(version.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(version.status().message().find("layout_version"), std::string::npos) << version.status();

  std::string magic = EncodeChunk(s.header, s.payload);
  magic[0] = 'X';
  EXPECT_EQ(DecodeChunk(magic).status().code(), absl::StatusCode::kInvalidArgument);

  std::string flipped = EncodeChunk(s.header, s.payload);
  flipped[40] ^= 1;  // inside the model fingerprint
  EXPECT_EQ(DecodeChunk(flipped).status().code(), absl::StatusCode::kDataLoss);
}

TEST(RendezvousHashTest, BalancedAndMovesOnlyTheRemovedServersKeys) {
  std::mt19937_64 rng(testing::FreshSeed());
  const std::vector<std::string> three = {"10.0.0.1:7000", "10.0.0.2:7000", "10.0.0.3:7000"};
  const std::vector<std::string> two = {three[0], three[2]};
  const int n = 30000;
  std::vector<int> counts(3);
  for (int i = 0; i < n; ++i) {
    const Hash128 key{rng(), rng()};
    const size_t owner = RendezvousOwner(key, three);
    ++counts[owner];
    EXPECT_EQ(owner, RendezvousOwner(key, three));  // deterministic
    const std::string& new_owner = two[RendezvousOwner(key, two)];
    if (owner != 1) {
      EXPECT_EQ(new_owner, three[owner]) << "a key of a surviving server moved";
    }
  }
  for (int c : counts) EXPECT_NEAR(c, n / 3.0, n * 0.03) << "unbalanced ownership";
}

TEST(ByteSizeTest, ParsesSuffixes) {
  EXPECT_EQ(*ParseByteSize("4096"), 4096u);
  EXPECT_EQ(*ParseByteSize("8GiB"), 8ull << 30);
  EXPECT_EQ(*ParseByteSize("512mib"), 512ull << 20);
  EXPECT_EQ(*ParseByteSize("64k"), 64ull << 10);
  EXPECT_EQ(*ParseByteSize("1.5G"), 3ull << 29);
  EXPECT_EQ(*ParseByteSize("2GB"), 2000000000ull);
  EXPECT_FALSE(ParseByteSize("GiB").ok());
  EXPECT_FALSE(ParseByteSize("12 parsecs").ok());
  EXPECT_FALSE(ParseByteSize("").ok());
  EXPECT_EQ(FormatByteSize(3ull << 20), "3.0 MiB");
}

}  // namespace
}  // namespace lazykv
