// The persistent prefill kernel's work-tile order (kernels/cuda/prefill_work_order.h): every
// work tile exactly once, the heaviest causal tiles first (by group), and a grid's worth of
// consecutive indices on few sequences (the reason for the groups), on random launch shapes.
#include "kernels/cuda/prefill_work_order.h"

#include <algorithm>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace lazykv {
namespace {

using cuda::MakePrefillWorkOrder;
using cuda::PrefillWorkAt;
using cuda::PrefillWorkCoords;
using cuda::PrefillWorkOrder;
using testing::FreshSeed;

std::vector<PrefillWorkCoords> List(const PrefillWorkOrder& o) {
  std::vector<PrefillWorkCoords> list;
  for (int i = 0; i < o.count; ++i) list.push_back(PrefillWorkAt(o, i));
  return list;
}

TEST(PrefillWorkOrderTest, EveryWorkTileOnceHeaviestGroupsFirstFewSequencesAtOnce) {
  const unsigned seed = FreshSeed();
  SCOPED_TRACE(seed);
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 300; ++trial) {
    const int heads = std::uniform_int_distribution<int>(1, 40)(rng);
    const int tiles = std::uniform_int_distribution<int>(1, 70)(rng);
    const int seqs = std::uniform_int_distribution<int>(1, 9)(rng);
    const long long ctas = std::uniform_int_distribution<int>(1, 264)(rng);
    SCOPED_TRACE(::testing::Message() << heads << " heads, " << tiles << " tiles, " << seqs << " seqs, " << ctas
                                      << " CTAs");
    const PrefillWorkOrder o = MakePrefillWorkOrder(heads, tiles, seqs, ctas);
    ASSERT_EQ(o.count, heads * tiles * seqs);
    const std::vector<PrefillWorkCoords> list = List(o);
    std::set<std::tuple<int, int, int>> seen;
    for (const PrefillWorkCoords& c : list) {
      ASSERT_GE(c.hx, 0);
      ASSERT_LT(c.hx, heads);
      ASSERT_GE(c.from_last, 0);
      ASSERT_LT(c.from_last, tiles);
      ASSERT_GE(c.sz, 0);
      ASSERT_LT(c.sz, seqs);
      ASSERT_TRUE(seen.emplace(c.hx, c.from_last, c.sz).second)
          << "twice: " << c.hx << " " << c.from_last << " " << c.sz;
    }
    // Heaviest first: a later index's tile is never more than a group's span nearer its
    // sequence's last than an earlier one's (causal work grows toward a sequence's last tile).
    int farthest = -1;
    for (const PrefillWorkCoords& c : list) {
      ASSERT_GT(c.from_last, farthest - o.group);
      farthest = std::max(farthest, c.from_last);
    }
    // What runs at once (a grid's worth of consecutive indices) reads at most three sequences'
    // keys, when a group can hold a grid's worth of a sequence's work tiles (in whole groups:
    // the last group, of tiles % group, is smaller).
    if (ctas / heads >= 1 && ctas / heads <= tiles) {
      for (int start = 0; start + ctas <= o.full_groups_count; start += static_cast<int>(ctas)) {
        std::set<int> seqs_at_once;
        for (int i = start; i < start + ctas; ++i) seqs_at_once.insert(list[i].sz);
        ASSERT_LE(seqs_at_once.size(), 3u) << "wave from " << start;
      }
    }
  }
}

// The shape the order was made for: 132 SMs, 32 heads, 4 sequences of 32 query tiles (4k).
TEST(PrefillWorkOrderTest, FirstWaveIsOneSequencesLastFourTiles) {
  const PrefillWorkOrder o = MakePrefillWorkOrder(32, 32, 4, 132);
  EXPECT_EQ(o.group, 4);
  for (int i = 0; i < 128; ++i) {
    const PrefillWorkCoords c = PrefillWorkAt(o, i);
    EXPECT_EQ(c.sz, 0) << i;
    EXPECT_EQ(c.hx, i % 32) << i;
    EXPECT_EQ(c.from_last, i / 32) << i;
  }
  const PrefillWorkCoords next = PrefillWorkAt(o, 128);  // the next sequence's same tiles
  EXPECT_EQ(next.sz, 1);
  EXPECT_EQ(next.from_last, 0);
  const PrefillWorkCoords last = PrefillWorkAt(o, o.count - 1);
  EXPECT_EQ(last.sz, 3);
  EXPECT_EQ(last.from_last, 31);
  EXPECT_EQ(last.hx, 31);
}

}  // namespace
}  // namespace lazykv
