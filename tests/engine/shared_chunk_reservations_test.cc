// SharedChunkReservations against a plain recount: the reserved blocks are always the
// blocks of the distinct chunks that the running requests (a multiset) use.
#include "worker/engine/shared_chunk_reservations.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <vector>

#include "tests/test_util.h"

namespace lazykv {
namespace {

using Chunk = SharedChunkReservations::Chunk;

Chunk C(uint64_t n, int blocks) { return Chunk{Hash128{n, ~n}, blocks}; }

int Recount(const std::vector<std::vector<Chunk>>& running) {
  std::map<std::pair<uint64_t, uint64_t>, int> distinct;
  for (const auto& request : running) {
    for (const Chunk& c : request) distinct[{c.key.high, c.key.low}] = c.blocks;
  }
  int total = 0;
  for (const auto& [key, blocks] : distinct) total += blocks;
  return total;
}

TEST(SharedChunkReservations, ASharedChunkCountsOnceAndLastUserReleasesIt) {
  SharedChunkReservations r;
  const std::vector<Chunk> first = {C(0, 1), C(1, 4), C(2, 2)};
  const std::vector<Chunk> second = {C(0, 1), C(2, 2), C(3, 5)};
  EXPECT_EQ(r.ExtraBlocks(first), 7);
  r.Add(first);
  EXPECT_EQ(r.ExtraBlocks(second), 5);  // only chunk 3 is new
  r.Add(second);
  EXPECT_EQ(r.reserved_blocks(), 12);
  r.Remove(first);
  EXPECT_EQ(r.reserved_blocks(), 8);  // 0 and 2 still used by the second request
  r.Remove(second);
  EXPECT_EQ(r.reserved_blocks(), 0);
}

TEST(SharedChunkReservations, ADocumentNamedTwiceInOneRequestCountsOnce) {
  SharedChunkReservations r;
  const std::vector<Chunk> twice = {C(0, 1), C(7, 3), C(7, 3)};
  EXPECT_EQ(r.ExtraBlocks(twice), 4);
  r.Add(twice);
  EXPECT_EQ(r.reserved_blocks(), 4);
  r.Remove(twice);
  EXPECT_EQ(r.reserved_blocks(), 0);
}

TEST(SharedChunkReservations, MatchesARecountUnderRandomAdmissions) {
  const uint64_t seed = testing::FreshSeed();
  SCOPED_TRACE(seed);
  std::mt19937_64 rng(seed);
  SharedChunkReservations r;
  std::vector<std::vector<Chunk>> running;
  for (int step = 0; step < 2000; ++step) {
    if (running.empty() || rng() % 2 == 0) {
      std::vector<Chunk> request = {C(0, 1)};  // the anchor
      const int docs = static_cast<int>(rng() % 5);
      for (int d = 0; d < docs; ++d) {
        const uint64_t doc = 1 + rng() % 20;
        request.push_back(C(doc, 1 + static_cast<int>(doc % 4)));
      }
      auto with = running;
      with.push_back(request);
      ASSERT_EQ(r.ExtraBlocks(request), Recount(with) - Recount(running));
      r.Add(request);
      running.push_back(request);
    } else {
      const size_t i = rng() % running.size();
      r.Remove(running[i]);
      running.erase(running.begin() + static_cast<long>(i));
    }
    ASSERT_EQ(r.reserved_blocks(), Recount(running));
  }
}

}  // namespace
}  // namespace lazykv
