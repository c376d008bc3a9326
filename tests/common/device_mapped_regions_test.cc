// The registry of pinned regions against a plain list of what was registered: lookups of
// random ranges in, across and outside several regions, before and after removal.
#include "common/device_mapped_regions.h"

#include <algorithm>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace lazykv {
namespace {

TEST(DeviceMappedRegionsTest, FindsTheRegionHoldingARangeAndNothingElse) {
  const uint64_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  static char memory[1 << 16];
  // Four disjoint regions, the first two adjacent, gaps between the others; device addresses
  // far away.
  struct Known {
    size_t at, bytes;
    bool writable;
    bool registered;
  };
  std::vector<Known> known = {
      {100, 1000, true, true}, {1100, 500, false, true}, {4096, 8192, true, true}, {20000, 30000, true, true}};
  char* device = reinterpret_cast<char*>(uintptr_t{1} << 40);
  for (const Known& k : known) RegisterDeviceMappedRegion(memory + k.at, k.bytes, device + k.at, k.writable);
  // Every registered region holding [at, at + n): one, or, for an empty range where two
  // adjacent regions meet, both (either is a right answer).
  auto naive = [&](size_t at, size_t n) {
    std::vector<const Known*> holding;
    for (const Known& k : known) {
      if (k.registered && at >= k.at && at + n <= k.at + k.bytes) holding.push_back(&k);
    }
    return holding;
  };
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < 20000; ++i) {
      const size_t at = rng() % 60000;
      const size_t n = rng() % 4 == 0 ? 0 : rng() % 3000;
      const std::vector<const Known*> want = naive(at, n);
      const std::optional<DeviceMappedRegion> got = FindDeviceMappedRegion(memory + at, n);
      ASSERT_EQ(got.has_value(), !want.empty()) << "at " << at << " n " << n;
      if (got) {
        const auto match = std::find_if(want.begin(), want.end(), [&](const Known* k) {
          return got->base == memory + k->at && got->bytes == k->bytes && got->writable == k->writable;
        });
        EXPECT_NE(match, want.end()) << "at " << at << " n " << n << ": a region that does not hold the range";
        EXPECT_EQ(got->DeviceAddress(memory + at), device + at);
      }
    }
    // Remove two regions: ranges in them are no longer found.
    UnregisterDeviceMappedRegion(memory + 1100);
    UnregisterDeviceMappedRegion(memory + 20000);
    known[1].registered = known[3].registered = false;
  }
  for (const Known& k : known) UnregisterDeviceMappedRegion(memory + k.at);
  EXPECT_FALSE(FindDeviceMappedRegion(memory + 200, 10).has_value());
}

}  // namespace
}  // namespace lazykv
