// PagedPieces (the arithmetic behind a GPU tier chunk's device pointers): runs within
// pages, adjacent pages merged, ranges and pages checked; and CudaIpcMapping refusing a
// malformed handle. The reference is a plain byte-by-byte address computation.
#include "worker/tier/cuda_ipc_mapping.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "tests/test_util.h"

namespace lazykv {
namespace {

TEST(PagedPiecesTest, EveryByteLandsWhereThePageListSays) {
  const uint64_t seed = testing::FreshSeed();
  SCOPED_TRACE(seed);
  std::mt19937_64 rng(seed);
  const char* base = reinterpret_cast<const char*>(0x100000);
  for (int round = 0; round < 200; ++round) {
    const uint64_t page = std::uniform_int_distribution<uint64_t>(1, 64)(rng);
    const uint64_t region_pages = std::uniform_int_distribution<uint64_t>(1, 40)(rng);
    std::vector<uint32_t> pages(std::uniform_int_distribution<uint64_t>(1, region_pages)(rng));
    for (uint32_t& p : pages) p = static_cast<uint32_t>(rng() % region_pages);
    if (rng() % 2) std::sort(pages.begin(), pages.end());  // runs of adjacent pages merge
    const uint64_t total = pages.size() * page;
    const uint64_t offset = rng() % total, length = rng() % (total - offset + 1);
    auto pieces = PagedPieces(base, region_pages * page, page, pages, offset, length);
    ASSERT_TRUE(pieces.ok()) << pieces.status();
    uint64_t b = offset, sum = 0;
    for (std::string_view piece : *pieces) {
      ASSERT_FALSE(piece.empty());
      for (uint64_t i = 0; i < piece.size(); ++i, ++b) {
        ASSERT_EQ(piece.data() + i, base + pages[b / page] * page + b % page) << "byte " << b;
      }
      sum += piece.size();
    }
    EXPECT_EQ(sum, length);
    for (size_t i = 1; i < pieces->size(); ++i) {
      EXPECT_NE((*pieces)[i - 1].data() + (*pieces)[i - 1].size(), (*pieces)[i].data()) << "adjacent runs not merged";
    }
  }
}

TEST(PagedPiecesTest, RefusesPagesOutsideTheRegionAndRangesPastThePages) {
  const char* base = reinterpret_cast<const char*>(0x1000);
  const std::vector<uint32_t> pages{0, 3};
  EXPECT_EQ(PagedPieces(base, 3 * 16, 16, pages, 0, 32).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PagedPieces(base, 4 * 16, 16, pages, 20, 13).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(PagedPieces(base, 4 * 16, 16, pages, 20, 12).ok());
  EXPECT_EQ(PagedPieces(base, 4 * 16, 0, pages, 0, 1).status().code(), absl::StatusCode::kInvalidArgument);
  // Sizes from a hostile answer: products and sums that would wrap.
  const std::vector<uint32_t> many{0, 1, 2, 3};
  EXPECT_EQ(PagedPieces(base, ~0ull, 1ull << 63, many, 0, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PagedPieces(base, 4 * 16, 16, pages, 8, ~0ull).status().code(), absl::StatusCode::kInvalidArgument);
  const std::vector<uint32_t> far{0xffffffffu};
  EXPECT_EQ(PagedPieces(base, 1ull << 40, 1ull << 20, far, 0, 1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CudaIpcMappingTest, AMalformedHandleOrAMissingGpuIsRefused) {
  auto opened = CudaIpcMapping::Open("short", std::string(16, '\0'), 0, 1 << 20, 1 << 16);
  EXPECT_FALSE(opened.ok());
  EXPECT_TRUE(opened.status().code() == absl::StatusCode::kInvalidArgument ||
              opened.status().code() == absl::StatusCode::kFailedPrecondition)
      << opened.status();
}

}  // namespace
}  // namespace lazykv
