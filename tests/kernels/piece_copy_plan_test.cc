// The piece copy kernel's plan (kernels/cuda/piece_copy_plan.h) on random piece layouts,
// checked by replaying it with memcpy on the host (the kernel's work, done plainly) against
// a naive gather or scatter of the pieces; and the layouts it must refuse.
#include "kernels/cuda/piece_copy_plan.h"

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace lazykv {
namespace {

using cuda::CopySegment;
using cuda::PlanCopySegments;
using testing::FreshSeed;

// Runs the plan as the kernel would, with host memcpy.
void Replay(const std::vector<CopySegment>& plan) {
  for (const CopySegment& s : plan) {
    std::memcpy(reinterpret_cast<void*>(s.dst), reinterpret_cast<const void*>(s.src), s.bytes);
  }
}

TEST(PieceCopyPlanTest, GatherAndScatterOfRandomPiecesEqualNaiveCopies) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 200; ++trial) {
    // Pieces of 16-byte multiples (some empty), the last of any size, at 16-aligned places
    // of one buffer in shuffled order; segments of a random 16-byte multiple.
    const int n = 1 + static_cast<int>(rng() % 20);
    std::vector<uint64_t> sizes(n);
    for (int i = 0; i < n; ++i) sizes[i] = rng() % 5 == 0 ? 0 : 16 * (rng() % 300);
    sizes[n - 1] = rng() % 4000;
    uint64_t total = 0;
    for (uint64_t s : sizes) total += s;
    std::vector<uint64_t> order(n);
    for (int i = 0; i < n; ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<uint64_t> place(n);
    uint64_t at = 0;
    for (uint64_t i : order) {
      place[i] = at;
      at += (sizes[i] + 15) / 16 * 16 + 16 * (rng() % 3);
    }
    alignas(16) static char arena[1 << 20];
    alignas(16) static char contiguous[1 << 20];
    ASSERT_LE(at, sizeof(arena));
    std::vector<std::string_view> pieces;
    for (int i = 0; i < n; ++i) pieces.emplace_back(arena + place[i], sizes[i]);
    for (uint64_t i = 0; i < at; ++i) arena[i] = static_cast<char>(rng());
    std::string naive;
    for (std::string_view p : pieces) naive.append(p);
    const uint64_t segment = 16 * (1 + rng() % 64);

    std::memset(contiguous, 0, total + 64);
    auto gather = PlanCopySegments(pieces, reinterpret_cast<uint64_t>(contiguous), true, segment);
    ASSERT_TRUE(gather.has_value()) << "trial " << trial;
    uint64_t expected_offset = 0;
    for (const CopySegment& s : *gather) {
      EXPECT_GT(s.bytes, 0u);
      EXPECT_LE(s.bytes, segment);
      EXPECT_EQ(s.offset, expected_offset);  // in order, no gap, no overlap
      EXPECT_EQ(s.dst, reinterpret_cast<uint64_t>(contiguous) + s.offset);
      expected_offset += s.bytes;
    }
    EXPECT_EQ(expected_offset, total);
    Replay(*gather);
    EXPECT_EQ(std::string(contiguous, total), naive) << "trial " << trial;
    EXPECT_EQ(contiguous[total], 0) << "wrote past the range";

    // Scatter: fresh bytes in the range go back into the pieces, and only there.
    std::string fresh(total, '\0');
    for (char& c : fresh) c = static_cast<char>(rng());
    std::memcpy(contiguous, fresh.data(), total);
    const std::string before(arena, at);
    auto scatter = PlanCopySegments(pieces, reinterpret_cast<uint64_t>(contiguous), false, segment);
    ASSERT_TRUE(scatter.has_value());
    Replay(*scatter);
    std::string expected_arena = before;
    uint64_t from = 0;
    for (int i = 0; i < n; ++i) {
      expected_arena.replace(place[i], sizes[i], fresh.substr(from, sizes[i]));
      from += sizes[i];
    }
    EXPECT_EQ(std::string(arena, at), expected_arena) << "trial " << trial;
  }
}

TEST(PieceCopyPlanTest, RefusesWhatTheKernelCannotCopy) {
  alignas(16) static char buffer[4096];
  const uint64_t range = reinterpret_cast<uint64_t>(buffer) + 2048;
  // A misaligned piece address.
  std::vector<std::string_view> pieces = {{buffer + 8, 32}};
  EXPECT_FALSE(PlanCopySegments(pieces, range, true).has_value());
  // A piece before the last whose size is not a multiple of 16.
  pieces = {{buffer, 40}, {buffer + 64, 32}};
  EXPECT_FALSE(PlanCopySegments(pieces, range, true).has_value());
  // ...but the last may have any size, and empty pieces after it do not count.
  pieces = {{buffer, 48}, {buffer + 64, 37}, {buffer + 128, 0}};
  auto plan = PlanCopySegments(pieces, range, true);
  ASSERT_TRUE(plan.has_value());
  ASSERT_EQ(plan->size(), 2u);
  EXPECT_EQ((*plan)[1].bytes, 37u);
  EXPECT_EQ((*plan)[1].offset, 48u);
  // A misaligned range, or a segment size that is no multiple of 16.
  EXPECT_FALSE(PlanCopySegments(pieces, range + 4, true).has_value());
  EXPECT_FALSE(PlanCopySegments(pieces, range, true, 24).has_value());
  EXPECT_FALSE(PlanCopySegments(pieces, range, true, 0).has_value());
  EXPECT_FALSE(PlanCopySegments(pieces, range, true, (1ull << 32) + 16).has_value()) << "past a segment's 32 bits";
  // Nothing to copy: an empty plan.
  pieces = {};
  plan = PlanCopySegments(pieces, range, true);
  ASSERT_TRUE(plan.has_value());
  EXPECT_TRUE(plan->empty());
}

}  // namespace
}  // namespace lazykv
