// The GPU timeline's summary (bench/trace_summary.h): the time some work ran, against a
// nanosecond-by-nanosecond count over fresh random intervals, and the per-name table on a
// hand-made timeline.
#include "bench/trace_summary.h"

#include <algorithm>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace lazykv::bench {
namespace {

using ::testing::ContainsRegex;

TEST(TraceSummaryTest, BusyTimeIsTheUnionOfTheRecords) {
  const uint64_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  const char* const kNames[] = {"k0", "k1", "k2"};
  for (int round = 0; round < 50; ++round) {
    std::vector<TraceRecord> records;
    const int n = 1 + static_cast<int>(rng() % 30);
    for (int i = 0; i < n; ++i) {  // overlapping, nested, touching and empty intervals, any order
      const uint64_t start = 100 + rng() % 5000, length = rng() % 4 == 0 ? 0 : rng() % 800;
      records.push_back({kNames[i % 3], start, start + length});
    }
    std::vector<bool> covered(7000, false);
    uint64_t first = ~uint64_t{0}, last = 0;
    for (const TraceRecord& r : records) {
      for (uint64_t t = r.start_ns; t < r.end_ns; ++t) covered[t] = true;
      first = std::min(first, r.start_ns);
      last = std::max(last, r.end_ns);
    }
    const TraceTotals totals = TotalTrace(records);
    EXPECT_EQ(totals.busy_ns, static_cast<uint64_t>(std::count(covered.begin(), covered.end(), true)));
    // What the names add covers the busy time exactly once.
    uint64_t added = 0;
    for (const auto& [name, ns] : AddedTime(records)) added += ns;
    EXPECT_EQ(added, totals.busy_ns);
    EXPECT_EQ(totals.span_ns, last - first);
  }
  EXPECT_EQ(TotalTrace({}).busy_ns, 0u);
  // A record whose end precedes its start (incomplete) counts as empty, not as 2^64 ns.
  const TraceTotals odd = TotalTrace({{"k", 100, 200}, {"k", 300, 250}});
  EXPECT_EQ(odd.busy_ns, 100u);
  EXPECT_EQ(odd.span_ns, 200u);
  EXPECT_THAT(SummarizeTrace({{"k", 100, 200}, {"k", 300, 250}}, 1), ContainsRegex("\nk +2\\.0 +0\\.1 "));
}

TEST(TraceSummaryTest, TablePerNameAndStep) {
  // Two steps: A twice (1 and 2 us), B once (1 us, overlapping both A's), 0.5 us of gap.
  const std::vector<TraceRecord> records = {
      {"A", 0, 1000}, {"B", 1500, 2500}, {"A", 2000, 4000}, {"memcpy", 4000, 4200}};
  const std::string table = SummarizeTrace(records, 2);
  EXPECT_THAT(table, ContainsRegex("\nA +1\\.0 +1\\.5 +71\\.4%"));  // 2 calls, 3 us over 2 steps; of 4.2 us
  EXPECT_THAT(table, ContainsRegex("\nB +0\\.5 +0\\.5 +23\\.8%"));
  EXPECT_THAT(table, ContainsRegex("\nmemcpy +0\\.5 +0\\.1 +4\\.8%"));
  EXPECT_THAT(table, ContainsRegex("span 2\\.1 us, some work running 1\\.9 us, gaps 0\\.2 us"));
  // Sorted by time: A before B before memcpy.
  EXPECT_LT(table.find("\nA "), table.find("\nB "));
  EXPECT_LT(table.find("\nB "), table.find("\nmemcpy "));
  EXPECT_EQ(SummarizeTrace({}, 3), "kernel trace: no records\n");
  // What each name adds to the end of the work so far, in order of start: A 1 + 1.5 us, B 1 us
  // (from 1.5 to 2.5: it started after A's end), memcpy 0.2: per step 1.25, 0.5, 0.1, summing
  // to the busy time.
  EXPECT_THAT(table, ContainsRegex("\nA +1\\.0 +1\\.5 +71\\.4% +1\\.[23]\n"));  // 1.25
  EXPECT_THAT(table, ContainsRegex("\nB +0\\.5 +0\\.5 +23\\.8% +0\\.5\n"));
  EXPECT_THAT(table, ContainsRegex("\nmemcpy +0\\.5 +0\\.1 +4\\.8% +0\\.1\n"));
  // A kernel launched early (a dependent launch) adds only what it runs past the one before.
  const std::string overlapped = SummarizeTrace({{"P", 0, 1000}, {"C", 100, 1300}, {"G", 200, 5000}}, 1);
  EXPECT_THAT(overlapped, ContainsRegex("\nC +1\\.0 +1\\.2 +[0-9.]+% +0\\.3\n"));
  EXPECT_THAT(overlapped, ContainsRegex("\nG +1\\.0 +4\\.8 +[0-9.]+% +3\\.7\n"));
  EXPECT_THAT(overlapped, ContainsRegex("\nP +1\\.0 +1\\.0 +[0-9.]+% +1\\.0\n"));
}

TEST(TraceSummaryTest, ShortKernelNames) {
  EXPECT_EQ(ShortKernelName("void lazykv::cuda::(anonymous namespace)::KvWriteKernel<__nv_bfloat16>("
                            "lazykv::cuda::KvWriteParams)"),
            "KvWriteKernel<__nv_bfloat16>");
  EXPECT_EQ(ShortKernelName("void lazykv::cuda::(anonymous namespace)::LazyPrefillSpecializedKernel<128>("
                            "lazykv::cuda::PrefillAttentionParams, int, float, int, int)"),
            "LazyPrefillSpecializedKernel<128>");
  // Template arguments keep their namespaces, spaces and parentheses.
  EXPECT_EQ(ShortKernelName("void ns::Gemm<ns::Tile<(int)64, 2>, float>(float const*, int)"),
            "Gemm<ns::Tile<(int)64, 2>, float>");
  EXPECT_EQ(ShortKernelName("nvjet_sm90_tss_128x16_64x11_2x1_v_bz_TNT"), "nvjet_sm90_tss_128x16_64x11_2x1_v_bz_TNT");
  EXPECT_EQ(ShortKernelName("void plain(int)"), "plain");
  EXPECT_EQ(ShortKernelName(std::string(100, 'x')).size(), 60u);
}

}  // namespace
}  // namespace lazykv::bench
