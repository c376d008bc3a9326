// The Zipf RAG trace: seeded and reproducible, well formed, and its popularity fits the
// requested law (expected probabilities computed here, independently of common/zipf.h).
#include "bench/rag_trace.h"

#include <cmath>
#include <map>
#include <set>

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace lazykv::testing {
namespace {

// Least-squares slope of log(frequency) against log(rank + 1) over [first, last).
double LogLogSlope(const std::vector<double>& freq, int first, int last) {
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  int n = 0;
  for (int r = first; r < last; ++r) {
    if (freq[r] <= 0) continue;
    const double x = std::log(r + 1.0), y = std::log(freq[r]);
    sx += x, sy += y, sxx += x * x, sxy += x * y;
    ++n;
  }
  return (n * sxy - sx * sy) / (n * sxx - sx * sx);
}

std::vector<double> FrequencyByRank(const RagTrace& trace) {
  std::vector<int> rank_of(trace.documents.size());
  for (size_t r = 0; r < trace.ranking.size(); ++r) rank_of[trace.ranking[r]] = static_cast<int>(r);
  std::vector<double> freq(trace.documents.size());
  double total = 0;
  for (const auto& request : trace.requests) {
    for (int d : request.doc_ids) freq[rank_of[d]] += 1, total += 1;
  }
  for (double& f : freq) f /= total;
  return freq;
}

TEST(RagTraceTest, SeededReproducibleAndRoundTrips) {
  TraceOptions o{.num_docs = 30,
                 .docs_per_request = 4,
                 .num_requests = 50,
                 .doc_lengths = "uniform:5:40",
                 .rate = 10,
                 .seed = FreshSeed()};
  const std::string a = TraceToJsonLines(*GenerateTrace(o));
  EXPECT_EQ(a, TraceToJsonLines(*GenerateTrace(o)));
  o.seed += 1;
  EXPECT_NE(a, TraceToJsonLines(*GenerateTrace(o)));
  auto parsed = ParseTraceJsonLines(a);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(TraceToJsonLines(*parsed), a);
  EXPECT_FALSE(ParseTraceJsonLines("{\"kind\": \"request\", \"id\": 1}\n").ok());
  EXPECT_FALSE(GenerateTrace(TraceOptions{.doc_lengths = "triangular:3"}).ok());
  EXPECT_FALSE(GenerateTrace(TraceOptions{.num_docs = 5, .docs_per_request = 6}).ok());
}

TEST(RagTraceTest, RequestsAreWellFormedAndArrivalsArePoisson) {
  const TraceOptions o{.num_docs = 200,
                       .docs_per_request = 8,
                       .zipf_s = 1.1,
                       .num_requests = 20000,
                       .doc_lengths = "uniform:100:300",
                       .question_tokens = 9,
                       .vocab_size = 300,
                       .rate = 50,
                       .seed = FreshSeed()};
  const RagTrace trace = *GenerateTrace(o);
  ASSERT_EQ(trace.documents.size(), 200u);
  for (const auto& doc : trace.documents) {
    EXPECT_GE(doc.size(), 100u);
    EXPECT_LE(doc.size(), 300u);
    for (int32_t t : doc) ASSERT_TRUE(t >= 3 && t < 300);
  }
  double previous = 0;
  std::map<int, int> first_position;  // documents appear first in a request in every position
  for (const auto& r : trace.requests) {
    ASSERT_EQ(r.doc_ids.size(), 8u);
    EXPECT_EQ(std::set<int>(r.doc_ids.begin(), r.doc_ids.end()).size(), 8u) << "documents repeat in a request";
    EXPECT_EQ(r.question.size(), 9u);
    EXPECT_GT(r.arrival_s, previous);
    previous = r.arrival_s;
    ++first_position[r.doc_ids[0]];
  }
  // 20000 exponential gaps of mean 1/50 s: the mean is within 4% (5.7 standard errors: a
  // fresh seed fails about once in 1e8 runs; 3% was 2e-5).
  EXPECT_NEAR(previous / o.num_requests, 1.0 / 50, 0.04 / 50);
  // Order is shuffled: the most popular document is not always first.
  EXPECT_LT(first_position[trace.ranking[0]], 0.5 * o.num_requests);
}

TEST(RagTraceTest, PopularityFitsTheZipfLaw) {
  for (double s : {0.8, 1.1}) {
    // One document per request: each draw follows Zipf(s) exactly.
    const RagTrace single = *GenerateTrace(TraceOptions{.num_docs = 500,
                                                        .docs_per_request = 1,
                                                        .zipf_s = s,
                                                        .num_requests = 100000,
                                                        .doc_lengths = "fixed:4",
                                                        .seed = FreshSeed()});
    const std::vector<double> freq = FrequencyByRank(single);
    double norm = 0;
    for (int r = 0; r < 500; ++r) norm += std::pow(r + 1.0, -s);
    for (int r = 0; r < 10; ++r) {
      const double p = std::pow(r + 1.0, -s) / norm;
      const double sigma = std::sqrt(p * (1 - p) / 100000);
      EXPECT_NEAR(freq[r], p, 6 * sigma) << "s=" << s << " rank " << r;  // 20 checks: 4e-8 a run
    }
    EXPECT_NEAR(LogLogSlope(freq, 0, 200), -s, 0.05) << "s=" << s;
    // Eight distinct documents per request: the head saturates (a document is in a request
    // at most once), the tail keeps the law.
    const RagTrace eight = *GenerateTrace(TraceOptions{.num_docs = 1000,
                                                       .docs_per_request = 8,
                                                       .zipf_s = s,
                                                       .num_requests = 40000,
                                                       .doc_lengths = "fixed:4",
                                                       .seed = FreshSeed()});
    EXPECT_NEAR(LogLogSlope(FrequencyByRank(eight), 50, 500), -s, 0.1) << "s=" << s;
  }
  // s = 0: uniform. Chi-square over 100 documents, 99 degrees of freedom: 190 is p < 1e-7, so a
  // fresh seed fails by chance about once in ten million runs (150, p < 0.001, failed a CI run at
  // 153.9). A skewed draw still fails by far: one document never drawn alone adds 500.
  const uint64_t seed = FreshSeed();
  const RagTrace uniform = *GenerateTrace(TraceOptions{.num_docs = 100,
                                                       .docs_per_request = 1,
                                                       .zipf_s = 0,
                                                       .num_requests = 50000,
                                                       .doc_lengths = "fixed:4",
                                                       .seed = seed});
  const std::vector<double> freq = FrequencyByRank(uniform);
  double chi2 = 0;
  for (double f : freq) chi2 += std::pow(f * 50000 - 500, 2) / 500;
  EXPECT_LT(chi2, 190) << "seed " << seed;
}

}  // namespace
}  // namespace lazykv::testing
