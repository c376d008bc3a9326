// The load test's statistics against naive computations written here: percentiles by a
// full sort, and every aggregate by plain loops over fresh random results.
#include "bench/load_stats.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "bench/load_report.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace lazykv::testing {
namespace {

// numpy's default ("linear"): sort, then interpolate at rank (n - 1) q / 100.
double NaivePercentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const double rank = (v.size() - 1) * q / 100;
  const size_t j = static_cast<size_t>(rank);
  if (j + 1 >= v.size()) return v.back();
  return v[j] * (1 - (rank - j)) + v[j + 1] * (rank - j);
}

std::vector<double> RandomValues(std::mt19937_64& rng, size_t n) {
  std::vector<double> v(n);
  // Few distinct values half the time: ties must not confuse the selection.
  const bool ties = rng() % 2;
  for (double& x : v) x = ties ? static_cast<double>(rng() % 5) : std::exponential_distribution<double>(0.1)(rng);
  return v;
}

TEST(LoadStatsTest, PercentileKnownValues) {
  // Values numpy.percentile gives for these inputs.
  EXPECT_DOUBLE_EQ(Percentile({1, 2, 3, 4}, 50), 2.5);
  EXPECT_DOUBLE_EQ(Percentile({4, 3, 2, 1}, 90), 3.7);
  EXPECT_DOUBLE_EQ(Percentile({15, 20, 35, 40, 50}, 40), 29);
  EXPECT_DOUBLE_EQ(Percentile({15, 20, 35, 40, 50}, 0), 15);
  EXPECT_DOUBLE_EQ(Percentile({15, 20, 35, 40, 50}, 100), 50);
  EXPECT_DOUBLE_EQ(Percentile({7}, 99), 7);
  EXPECT_EQ(Percentile({}, 50), 0);
}

TEST(LoadStatsTest, PercentileAndSummaryMatchNaiveOnRandomInputs) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(seed);
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 200; ++trial) {
    const std::vector<double> v = RandomValues(rng, 1 + rng() % 300);
    for (double q : {0.0, 1.0, 50.0, 90.0, 99.0, 100.0, std::uniform_real_distribution<double>(0, 100)(rng)}) {
      const double p = Percentile(v, q);
      EXPECT_NEAR(p, NaivePercentile(v, q), 1e-9 * (1 + std::abs(p))) << "n " << v.size() << " q " << q;
      // Whatever the interpolation, at most q% of the values lie strictly below it and
      // at most (100 - q)% strictly above.
      const double below = std::count_if(v.begin(), v.end(), [&](double x) { return x < p - 1e-12; });
      const double above = std::count_if(v.begin(), v.end(), [&](double x) { return x > p + 1e-12; });
      EXPECT_LE(below, q / 100 * (v.size() - 1) + 1);
      EXPECT_LE(above, (1 - q / 100) * (v.size() - 1) + 1);
    }
    const Distribution d = Summarize(v);
    double sum = 0, max = v[0];
    for (double x : v) sum += x, max = std::max(max, x);
    EXPECT_EQ(d.count, static_cast<int64_t>(v.size()));
    EXPECT_NEAR(d.mean, sum / v.size(), 1e-9 * (1 + std::abs(sum)));
    EXPECT_EQ(d.max, max);
    EXPECT_NEAR(d.p50, NaivePercentile(v, 50), 1e-9 * (1 + d.p50));
    EXPECT_NEAR(d.p90, NaivePercentile(v, 90), 1e-9 * (1 + d.p90));
    EXPECT_NEAR(d.p99, NaivePercentile(v, 99), 1e-9 * (1 + d.p99));
  }
  EXPECT_EQ(Summarize({}).count, 0);
}

RequestResult RandomResult(std::mt19937_64& rng, int id) {
  static const char* kStatuses[] = {"OK", "OK", "OK", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED"};
  RequestResult r;
  r.id = id;
  r.status = kStatuses[rng() % 5];
  r.ttft_ms = rng() % 10 == 0 ? -1 : std::exponential_distribution<double>(0.05)(rng);
  r.total_ms = 100 + rng() % 1000;
  for (int i = rng() % 6; i > 0; --i) r.itl_ms.push_back(1 + rng() % 50);
  r.mode = rng() % 2 ? "lazy" : "block";
  auto count = [&] { return static_cast<int64_t>(rng() % 1000); };
  auto large = [&] { return static_cast<int64_t>(rng() % 100000); };
  r.usage = UsageCounts{count(), count(), count(), count(), count(), count(), count(),
                        count(), count(), count(), count(), large(), large()};
  r.usage.cached_documents = static_cast<int64_t>(rng() % 5);
  r.server_queue_ms = rng() % 20;
  r.server_ttft_ms = rng() % 200;
  r.server_total_ms = rng() % 2000;
  return r;
}

TEST(LoadStatsTest, SummarizeRunMatchesPlainLoops) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(seed);
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<RequestResult> results;
    for (int i = 0, n = 1 + rng() % 200; i < n; ++i) results.push_back(RandomResult(rng, i));
    const double wall_s = 0.5 + rng() % 100;
    const int64_t distinct = 1 + rng() % 5000;
    const LoadSummary s = SummarizeRun(results, wall_s, distinct);

    int64_t ok = 0, doc = 0, cached = 0, doc_computed = 0, completion = 0, pool = 0, computed = 0, fetched = 0;
    uint64_t copied = 0;
    std::map<std::string, int64_t> errors, modes;
    std::vector<double> ttft, itl, queue;
    std::map<int64_t, std::vector<double>> ttft_by_cached;
    for (const RequestResult& r : results) {
      if (r.status != "OK") {
        ++errors[r.status];
        continue;
      }
      ++ok;
      ++modes[r.mode];
      doc += r.usage.document_tokens;
      cached += r.usage.document_cached_tokens;
      doc_computed += r.usage.document_computed_tokens;
      completion += r.usage.completion_tokens;
      pool += r.usage.pool_tokens;
      computed += r.usage.computed_tokens;
      copied += r.usage.kv_bytes_copied;
      fetched += static_cast<int64_t>(r.usage.kv_bytes_fetched);
      if (r.ttft_ms >= 0) ttft.push_back(r.ttft_ms);
      if (r.ttft_ms >= 0) ttft_by_cached[r.usage.cached_documents].push_back(r.ttft_ms);
      for (double x : r.itl_ms) itl.push_back(x);
      queue.push_back(r.server_queue_ms);
    }
    EXPECT_EQ(s.requests, static_cast<int64_t>(results.size()));
    EXPECT_EQ(s.succeeded, ok);
    EXPECT_EQ(s.errors, errors);
    EXPECT_EQ(s.modes_served, modes);
    EXPECT_EQ(s.usage.document_tokens, doc);
    EXPECT_EQ(s.usage.pool_tokens, pool);
    EXPECT_EQ(s.usage.computed_tokens, computed);
    EXPECT_EQ(s.usage.kv_bytes_copied, copied);
    EXPECT_EQ(static_cast<int64_t>(s.usage.kv_bytes_fetched), fetched);
    EXPECT_DOUBLE_EQ(s.hit_ratio, doc > 0 ? static_cast<double>(cached) / doc : 0);
    EXPECT_DOUBLE_EQ(s.fleet_compute, static_cast<double>(doc_computed) / distinct);
    EXPECT_DOUBLE_EQ(s.request_throughput, ok / wall_s);
    EXPECT_DOUBLE_EQ(s.output_token_throughput, completion / wall_s);
    EXPECT_EQ(s.ttft_ms.count, static_cast<int64_t>(ttft.size()));
    if (!ttft.empty()) {
      EXPECT_NEAR(s.ttft_ms.p99, NaivePercentile(ttft, 99), 1e-9 * (1 + s.ttft_ms.p99));
    }
    ASSERT_EQ(s.ttft_ms_by_cached_documents.size(), ttft_by_cached.size());
    for (const auto& [k, values] : ttft_by_cached) {
      EXPECT_EQ(s.ttft_ms_by_cached_documents.at(k).count, static_cast<int64_t>(values.size()));
      EXPECT_NEAR(s.ttft_ms_by_cached_documents.at(k).p50, NaivePercentile(values, 50), 1e-9 * (1 + values[0]));
    }
    EXPECT_EQ(s.itl_ms.count, static_cast<int64_t>(itl.size()));
    if (!itl.empty()) {
      EXPECT_NEAR(s.itl_ms.p50, NaivePercentile(itl, 50), 1e-9 * (1 + s.itl_ms.p50));
    }
    if (!queue.empty()) {
      EXPECT_NEAR(s.server_queue_ms.p90, NaivePercentile(queue, 90), 1e-9 * (1 + s.server_queue_ms.p90));
    }

    // The JSON carries the same numbers.
    const nlohmann::json j = ToJson(s);
    EXPECT_EQ(j["succeeded"], ok);
    EXPECT_EQ(j["usage"]["document_cached_tokens"], cached);
    EXPECT_DOUBLE_EQ(j["fleet_compute"].get<double>(), s.fleet_compute);
    EXPECT_EQ(j["errors"].size(), errors.size());
  }
}

TEST(LoadStatsTest, DistinctDocumentTokensCountsTouchedDocumentsOnceByContent) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(seed);
  // More documents than 5 requests of 3 can touch: untouched ones must not count.
  RagTrace trace = *GenerateTrace(TraceOptions{.num_docs = 40,
                                               .docs_per_request = 3,
                                               .zipf_s = 0.5,
                                               .num_requests = 5,
                                               .doc_lengths = "uniform:10:90",
                                               .seed = seed});
  std::set<int> touched;
  for (const TraceRequest& r : trace.requests) touched.insert(r.doc_ids.begin(), r.doc_ids.end());
  int64_t naive = 0;
  for (int d : touched) naive += static_cast<int64_t>(trace.documents[d].size());
  EXPECT_EQ(DistinctDocumentTokens(trace), naive);

  // A document with another's tokens is the same chunk: counted once.
  const int a = trace.requests[0].doc_ids[0], b = trace.requests[0].doc_ids[1];
  const int64_t b_length = static_cast<int64_t>(trace.documents[b].size());
  trace.documents[b] = trace.documents[a];
  EXPECT_EQ(DistinctDocumentTokens(trace), naive - b_length);
}

TEST(LoadStatsTest, CompareTableHasOneRowPerMode) {
  LoadSummary lazy, none;
  lazy.hit_ratio = 0.75;
  none.requests = 3;
  const std::string table = FormatCompareTable({{"lazy", lazy}, {"none", none}});
  EXPECT_NE(table.find("\nlazy "), std::string::npos) << table;
  EXPECT_NE(table.find("\nnone "), std::string::npos) << table;
  EXPECT_NE(table.find("0.750"), std::string::npos) << table;
}

}  // namespace
}  // namespace lazykv::testing
