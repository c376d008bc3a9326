// ChunkBytes and WriteToPieces against plain string operations, over random piece
// boundaries: a slice, copy or write that crosses a piece edge must see the same bytes.
#include "common/chunk_bytes.h"

#include <gtest/gtest.h>

#include <random>

#include "tests/test_util.h"

namespace lazykv {
namespace {

// `text` cut at random points into pieces owned by one shared string.
ChunkBytes RandomPieces(std::mt19937_64& rng, const std::string& text) {
  auto owned = std::make_shared<const std::string>(text);
  std::vector<std::string_view> pieces;
  size_t at = 0;
  while (at < owned->size()) {
    const size_t n = std::min<size_t>(owned->size() - at, 1 + rng() % 17);
    pieces.push_back(std::string_view(*owned).substr(at, n));
    at += n;
  }
  return ChunkBytes(std::move(pieces), owned);
}

TEST(ChunkBytesTest, SlicesAndCopiesMatchTheString) {
  std::mt19937_64 rng(testing::FreshSeed());
  for (int round = 0; round < 200; ++round) {
    std::string text(rng() % 200, '\0');
    for (char& c : text) c = static_cast<char>('a' + rng() % 26);
    const ChunkBytes bytes = RandomPieces(rng, text);
    ASSERT_EQ(bytes.size(), text.size());
    ASSERT_EQ(bytes.ToString(), text);
    const size_t offset = text.empty() ? 0 : rng() % (text.size() + 1);
    const size_t length = rng() % (text.size() + 5);
    EXPECT_EQ(bytes.Slice(offset, length).ToString(), text.substr(offset, length));
    const size_t n = std::min(length, text.size() - offset);
    std::string copied(n, '?');
    bytes.CopyTo(offset, n, copied.data());
    EXPECT_EQ(copied, text.substr(offset, n));
  }
}

TEST(ChunkBytesTest, ASliceKeepsItsOwnerAlive) {
  ChunkBytes slice;
  {
    const ChunkBytes whole = ChunkBytes::FromString(std::string(1000, 'x') + "tail");
    slice = whole.Slice(1000, 4);
  }
  EXPECT_EQ(slice.ToString(), "tail");
}

// A chunk whose header is on the host and payload on a GPU (plain memory stands in for the
// device here: only the bookkeeping is under test). Slices say where their device part
// starts; CopyTo reads the host part and refuses the device part.
TEST(ChunkBytesTest, ADeviceTailIsTrackedThroughSlicesAndNeverCopiedOnTheHost) {
  const std::string header = "HEADER", device_a = "payload-", device_b = "tail";
  const ChunkBytes bytes = ChunkBytes::WithDeviceTail({header}, {device_a, device_b}, nullptr);
  EXPECT_EQ(bytes.size(), header.size() + device_a.size() + device_b.size());
  EXPECT_EQ(bytes.on_device_from(), header.size());
  EXPECT_TRUE(bytes.on_device());
  std::string got(header.size(), '\0');
  bytes.CopyTo(0, header.size(), got.data());
  EXPECT_EQ(got, header);
  const ChunkBytes payload = bytes.Slice(header.size(), bytes.size());
  EXPECT_EQ(payload.on_device_from(), 0u);
  EXPECT_EQ(payload.size(), device_a.size() + device_b.size());
  const ChunkBytes straddling = bytes.Slice(3, 6);  // "DER" on the host, "pay" on the device
  EXPECT_EQ(straddling.on_device_from(), 3u);
  EXPECT_EQ(straddling.size(), 6u);
  const ChunkBytes host_only = bytes.Slice(1, 4);
  EXPECT_FALSE(host_only.on_device());
  EXPECT_EQ(host_only.ToString(), "EADE");
  EXPECT_FALSE(ChunkBytes::FromString("abc").on_device());
  EXPECT_DEATH(bytes.CopyTo(2, 6, got.data()), "rest in GPU memory");
}

TEST(ChunkBytesTest, WriteToPiecesFillsAcrossEdges) {
  std::mt19937_64 rng(testing::FreshSeed());
  for (int round = 0; round < 200; ++round) {
    std::string buffer(1 + rng() % 100, '.');
    MutablePieces pieces;
    for (size_t at = 0; at < buffer.size();) {
      const size_t n = std::min<size_t>(buffer.size() - at, 1 + rng() % 9);
      pieces.emplace_back(buffer.data() + at, n);
      at += n;
    }
    const size_t offset = rng() % buffer.size();
    std::string bytes(rng() % (buffer.size() - offset + 1), '\0');
    for (char& c : bytes) c = static_cast<char>('A' + rng() % 26);
    std::string expected = buffer;
    expected.replace(offset, bytes.size(), bytes);
    WriteToPieces(pieces, offset, bytes);
    EXPECT_EQ(buffer, expected);
  }
}

}  // namespace
}  // namespace lazykv
