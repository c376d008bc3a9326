// The chunk MAC against HMAC-SHA256 values computed outside this code (Python's hmac
// module), its failure on any altered byte, and the payload finiteness check against a
// plain per-value loop, with pieces split anywhere.
#include "common/chunk_mac.h"

#include <array>
#include <cmath>
#include <cstring>
#include <fstream>
#include <random>

#include "absl/strings/str_format.h"
#include "common/chunk_values.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace lazykv::testing {
namespace {

std::vector<std::string_view> Split(std::string_view bytes, std::mt19937_64& rng) {
  std::vector<std::string_view> pieces;
  while (!bytes.empty()) {
    const size_t n = std::min<size_t>(bytes.size(), 1 + rng() % 9);
    pieces.push_back(bytes.substr(0, n));
    bytes.remove_prefix(n);
  }
  return pieces;
}

ChunkHeader TestHeader(std::string_view payload) {
  ChunkLayout layout{
      .num_layers = 1, .n_kv_heads = 1, .head_dim = 4, .num_tokens = 2, .anchor_tokens = 1, .dtype = KvDtype::kFp32};
  return MakeChunkHeader(Hash128{1, 2}, Hash128{3, 4}, layout, payload);
}

constexpr char kExpectedTag[] = "341793029c31974825f3a204ec10ec966662ede2f7cad401efe4e8bdb7489098";

TEST(ChunkMacTest, MatchesHmacSha256ComputedIndependently) {
  // python3: hmac.new(key, header[:88] + payload, 'sha256').hexdigest(), with the header
  // bytes of this very layout (below) and key b"k" * 32.
  const std::string payload(64, '\x01');
  const ChunkHeader header = TestHeader(payload);
  const std::string encoded = EncodeChunkHeader(header);
  const ChunkMac mac(std::string(32, 'k'));
  const std::string_view piece(payload);
  const auto tag = mac.Sign(header, std::span(&piece, 1));
  std::string hex;
  for (uint8_t b : tag) hex += absl::StrFormat("%02x", b);
  std::string header_hex;
  for (size_t i = 0; i < kChunkMacCoveredHeaderBytes; ++i) header_hex += absl::StrFormat("%02x", uint8_t(encoded[i]));
  EXPECT_EQ(hex, kExpectedTag) << "header bytes: " << header_hex;
}

TEST(ChunkMacTest, AnyAlteredByteOrAnotherKeyFailsAndPiecesDoNotMatter) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  std::string payload(512, '\0');
  for (char& c : payload) c = static_cast<char>(rng());
  ChunkHeader header = MakeChunkHeader(Hash128{5, 6}, Hash128{7, 8},  // 2 layers x K|V x 8 tokens x 4 floats
                                       ChunkLayout{.num_layers = 2,
                                                   .n_kv_heads = 1,
                                                   .head_dim = 4,
                                                   .num_tokens = 8,
                                                   .anchor_tokens = 1,
                                                   .dtype = KvDtype::kFp32},
                                       payload);
  const ChunkMac mac(std::string(40, 's'));
  const std::string_view whole(payload);
  header.mac = mac.Sign(header, std::span(&whole, 1));
  EXPECT_TRUE(mac.Verify(header, std::span(&whole, 1)).ok());
  const auto pieces = Split(payload, rng);
  EXPECT_TRUE(mac.Verify(header, pieces).ok()) << "the tag depends on how the payload is cut";
  // Another key, an unsigned header, a changed payload byte, a changed header field.
  EXPECT_EQ(ChunkMac(std::string(40, 't')).Verify(header, std::span(&whole, 1)).code(),
            absl::StatusCode::kPermissionDenied);
  ChunkHeader unsigned_header = header;
  unsigned_header.mac = {};
  EXPECT_FALSE(mac.Verify(unsigned_header, std::span(&whole, 1)).ok());
  std::string altered = payload;
  altered[rng() % altered.size()] ^= static_cast<char>(1 << (rng() % 8));
  const std::string_view altered_view(altered);
  EXPECT_FALSE(mac.Verify(header, std::span(&altered_view, 1)).ok());
  for (int field = 0; field < 4; ++field) {
    ChunkHeader h = header;
    if (field == 0) h.key.low ^= 1;
    if (field == 1) h.model_fingerprint.high ^= 1;
    if (field == 2) h.layout.anchor_tokens += 1;
    if (field == 3) h.payload_checksum ^= 1;
    EXPECT_FALSE(mac.Verify(h, std::span(&whole, 1)).ok()) << "field " << field;
  }
  // The tag survives encoding and decoding of the header.
  auto decoded = DecodeChunkHeader(EncodeChunkHeader(header));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->mac, header.mac);
  EXPECT_TRUE(mac.Verify(*decoded, std::span(&whole, 1)).ok());
}

TEST(ChunkMacTest, KeyFilesNeedThirtyTwoBytes) {
  const std::string dir = ::testing::TempDir();
  std::ofstream(dir + "/short.key") << "too short\n";
  std::ofstream(dir + "/good.key") << std::string(32, 'x') << "\n";
  EXPECT_EQ(ChunkMac::FromKeyFile(dir + "/short.key").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ChunkMac::FromKeyFile(dir + "/absent.key").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(ChunkMac::FromKeyFile(dir + "/good.key").ok());
}

// Plain reference: decode each value's exponent bits one by one.
bool ReferenceFinite(KvDtype dtype, const std::string& bytes) {
  const size_t width = dtype == KvDtype::kFp32 ? 4 : 2;
  for (size_t i = 0; i + width <= bytes.size(); i += width) {
    uint32_t v = 0;
    std::memcpy(&v, bytes.data() + i, width);
    const uint32_t exponent = dtype == KvDtype::kFp32   ? (v >> 23) & 0xFF
                              : dtype == KvDtype::kBf16 ? (v >> 7) & 0xFF
                                                        : (v >> 10) & 0x1F;
    const uint32_t all_ones = dtype == KvDtype::kFp16 ? 0x1F : 0xFF;
    if (exponent == all_ones) return false;
  }
  return true;
}

TEST(ChunkValuesTest, NonFiniteValuesAreFoundWhereverThePiecesSplit) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  int found = 0;
  for (int round = 0; round < 300; ++round) {
    const KvDtype dtype = std::array{KvDtype::kFp32, KvDtype::kBf16, KvDtype::kFp16}[rng() % 3];
    const size_t width = dtype == KvDtype::kFp32 ? 4 : 2;
    std::string bytes((1 + rng() % 64) * width, '\0');
    for (size_t i = 0; i < bytes.size(); i += width) {  // finite values
      const float f = std::uniform_real_distribution<float>(-8, 8)(rng);
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      if (width == 4) {
        std::memcpy(&bytes[i], &bits, 4);
      } else {
        const uint16_t half =
            dtype == KvDtype::kBf16 ? static_cast<uint16_t>(bits >> 16) : static_cast<uint16_t>(0x3C00);
        std::memcpy(&bytes[i], &half, 2);
      }
    }
    if (rng() % 2) {  // plant a NaN or an infinity
      const size_t at = (rng() % (bytes.size() / width)) * width;
      const uint32_t bad = dtype == KvDtype::kFp32   ? (rng() % 2 ? 0x7FC00000u : 0xFF800000u)
                           : dtype == KvDtype::kBf16 ? (rng() % 2 ? 0x7FC0u : 0xFF80u)
                                                     : (rng() % 2 ? 0x7E00u : 0xFC00u);
      std::memcpy(&bytes[at], &bad, width);
    }
    const bool finite = ReferenceFinite(dtype, bytes);
    found += !finite;
    const auto pieces = Split(bytes, rng);
    EXPECT_EQ(CheckPayloadFinite(dtype, pieces).ok(), finite) << "round " << round;
    if (!finite) {
      EXPECT_EQ(CheckPayloadFinite(dtype, pieces).code(), absl::StatusCode::kDataLoss);
    }
  }
  EXPECT_GT(found, 50);
}

}  // namespace
}  // namespace lazykv::testing
