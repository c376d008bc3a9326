// The lazy prefill CTAs' 32-way search (kernels/cuda/entry_search.h), run as the kernel's warp
// runs it (32 lanes probe, the lowest past lane decides) on random sorted block starts, against
// std::upper_bound; and its round counts, the reason it exists.
#include "kernels/cuda/entry_search.h"

#include <algorithm>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace lazykv {
namespace {

using cuda::EntrySearchRound;
using testing::FreshSeed;

struct Found {
  int entry = -1;
  int rounds = 0;
};

// FirstEntryPast (lazy_prefill_cta.cuh) with the warp's lanes as a loop.
Found WarpSearch(const std::vector<int>& starts, int lo, int hi, int pos) {
  EntrySearchRound round{lo, hi};
  Found found;
  for (;;) {
    ++found.rounds;
    unsigned ballot = 0;  // __ballot_sync of the 32 lanes
    for (int lane = 0; lane < 32; ++lane) {
      const bool past = round.ProbeIsPast(lane, pos, [&](int idx) {
        EXPECT_TRUE(idx >= 0 && idx < static_cast<int>(starts.size())) << "a load outside the table: " << idx;
        return starts.at(idx);
      });
      if (past) ballot |= 1u << lane;
    }
    if (round.Next(EntrySearchRound::FirstLane(ballot), &found.entry)) return found;
    EXPECT_LT(found.rounds, 10) << "the range does not shrink";
    if (found.rounds >= 10) return found;
  }
}

TEST(EntrySearchTest, FindsTheFirstEntryPastAPositionAsUpperBoundDoes) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 3000; ++trial) {
    // A table's starts: non-decreasing (blocks in logical order; a partly filled block and a
    // document at the same start repeat a value), sizes up to 40000 entries.
    const int n = static_cast<int>(rng() % (trial % 3 == 0 ? 40000 : 1200)) + 1;
    std::vector<int> starts(n);
    int at = static_cast<int>(rng() % 100);
    for (int& s : starts) {
      s = at;
      at += static_cast<int>(rng() % 3) * 16;  // 0: a repeat
    }
    const int lo = static_cast<int>(rng() % n), hi = lo + static_cast<int>(rng() % (n - lo + 1));
    // Positions before, inside and after the table's starts, exactly on one, and on one of the
    // searched range (where the answer is neither end of it).
    int pos;
    switch (rng() % 5) {
      case 0:
        pos = starts[rng() % n];
        break;
      case 4:
        pos = starts[lo + (hi > lo ? rng() % (hi - lo) : 0)] + static_cast<int>(rng() % 2) - 1;
        break;
      case 1:
        pos = starts[0] - 1 - static_cast<int>(rng() % 5);
        break;
      case 2:
        pos = starts[n - 1] + static_cast<int>(rng() % 5);
        break;
      default:
        pos = starts[0] + static_cast<int>(rng() % (starts[n - 1] - starts[0] + 1));
    }
    const int want = static_cast<int>(std::upper_bound(starts.begin() + lo, starts.begin() + hi, pos) - starts.begin());
    const Found got = WarpSearch(starts, lo, hi, pos);
    ASSERT_EQ(got.entry, want) << "trial " << trial << ": entries [" << lo << ", " << hi << ") of " << n
                               << ", position " << pos;
    const int size = hi - lo;
    // One round per factor of 32 (and a last one of step 1): two up to 1024 entries.
    const int most = size <= 32 ? 1 : size <= 1024 ? 2 : size <= 32768 ? 3 : 4;
    EXPECT_LE(got.rounds, most) << size << " entries";
  }
}

TEST(EntrySearchTest, EmptyAndSingleEntryRanges) {
  const std::vector<int> starts = {0, 16, 16, 32};
  EXPECT_EQ(WarpSearch(starts, 2, 2, 100).entry, 2);  // empty: hi
  EXPECT_EQ(WarpSearch(starts, 1, 2, 15).entry, 1);   // the entry itself is past
  EXPECT_EQ(WarpSearch(starts, 1, 2, 16).entry, 2);   // not past: hi
  EXPECT_EQ(WarpSearch(starts, 0, 4, 16).entry, 3);   // past the repeats
  EXPECT_EQ(WarpSearch(starts, 0, 4, -1).entry, 0);
}

}  // namespace
}  // namespace lazykv
