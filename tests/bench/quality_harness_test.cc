// The output-quality harness (bench/quality/), short form: its arithmetic against hand
// computations, teacher forcing against one request per position, and a few cases on a
// trained model where prefix must equal none exactly and lazy must equal block, with the
// BOS anchor, the long anchor and no anchor at all.
#include <algorithm>
#include <cmath>

#include "bench/quality/quality_cases.h"
#include "bench/quality/quality_metrics.h"
#include "bench/quality/quality_report.h"
#include "bench/quality/quality_run.h"
#include "bench/quality/quality_scorer.h"
#include "gtest/gtest.h"
#include "tests/engine/engine_test_util.h"
#include "tests/test_util.h"
#include "worker/model/llama2c_loader.h"
#include "worker/tokenizer/tokenizer.h"

namespace lazykv::testing {
namespace {

using namespace lazykv::quality;  // NOLINT: the harness under test

TEST(QualityMetricsTest, LogProbAndPerplexityByHand) {
  // Row 0: four equal logits, p = 1/4. Row 1: logits ln 1 and ln 3, p(1) = 3/4.
  const std::vector<std::vector<float>> logits = {{0, 0, 0, 0}, {0, std::log(3.0f)}};
  EXPECT_NEAR(LogProbOf(logits[0], 2), std::log(0.25), 1e-6);
  EXPECT_NEAR(LogProbOf(logits[1], 1), std::log(0.75), 1e-6);
  EXPECT_NEAR(LogProbOf(logits[1], 0), std::log(0.25), 1e-6);
  EXPECT_TRUE(std::isinf(LogProbOf(logits[1], 2)));
  const std::vector<double> lps = {LogProbOf(logits[0], 2), LogProbOf(logits[1], 1)};
  // exp(-(ln 1/4 + ln 3/4) / 2) = sqrt(4 * 4/3)
  EXPECT_NEAR(Perplexity(lps), std::sqrt(16.0 / 3.0), 1e-6);
  EXPECT_NEAR(MeanNll(lps), -(std::log(0.25) + std::log(0.75)) / 2, 1e-6);  // ln 3 in fp32
  EXPECT_EQ(Perplexity({}), 1.0);
  // Large logits stay finite (the max is subtracted).
  const std::vector<float> big = {1000.0f, 1000.0f};
  EXPECT_NEAR(LogProbOf(big, 0), std::log(0.5), 1e-6);
  EXPECT_EQ(ArgMax(big), 0);  // ties: the lowest id, as greedy sampling picks
  EXPECT_EQ(ArgMax(logits[1]), 1);
}

TEST(QualityMetricsTest, GreedyAgreement) {
  const std::vector<int32_t> ref = {1, 2, 3, 4};
  Agreement a = GreedyAgreement(std::vector<int32_t>{1, 2, 9, 4}, ref);
  EXPECT_EQ(a.first_divergence, 2);
  EXPECT_DOUBLE_EQ(a.prefix, 0.5);
  EXPECT_DOUBLE_EQ(a.overall, 0.75);
  a = GreedyAgreement(std::vector<int32_t>{1, 2}, ref);  // ended early: differs from there on
  EXPECT_DOUBLE_EQ(a.prefix, 0.5);
  EXPECT_DOUBLE_EQ(a.overall, 0.5);
  a = GreedyAgreement(ref, ref);
  EXPECT_EQ(a.first_divergence, 4);
  EXPECT_DOUBLE_EQ(a.prefix, 1);
  EXPECT_DOUBLE_EQ(a.overall, 1);
  a = GreedyAgreement(std::vector<int32_t>{7, 2, 3, 4, 5}, ref);
  EXPECT_DOUBLE_EQ(a.prefix, 0);
  EXPECT_DOUBLE_EQ(a.overall, 0.75);
}

TEST(QualityMetricsTest, IntervalsAndErrors) {
  const std::vector<double> same(10, 2.0);
  const Interval s = BootstrapMean(same);
  EXPECT_EQ(s.mean, 2.0);
  EXPECT_EQ(s.low, 2.0);
  EXPECT_EQ(s.high, 2.0);
  std::vector<double> coin;
  for (int i = 0; i < 100; ++i) coin.push_back(i % 2);
  const Interval b = BootstrapMean(coin, 4000, 3);
  EXPECT_DOUBLE_EQ(b.mean, 0.5);
  // sd of the mean: 0.5 / sqrt(100) = 0.05, so the 95% interval is about +-0.098.
  EXPECT_NEAR(b.low, 0.402, 0.02);
  EXPECT_NEAR(b.high, 0.598, 0.02);
  EXPECT_EQ(BootstrapMean(coin, 4000, 3).low, b.low);  // seeded: reproducible
  const Interval n = NormalMean(std::vector<double>{1, 2, 3});
  EXPECT_DOUBLE_EQ(n.mean, 2);
  EXPECT_NEAR(n.high - n.mean, 1.96 / std::sqrt(3.0), 1e-12);  // sample sd 1
  const Interval e = ExpInterval(Interval{.mean = 0, .low = -1, .high = 1, .n = 3});
  EXPECT_DOUBLE_EQ(e.mean, 1);
  EXPECT_NEAR(e.low, std::exp(-1.0), 1e-12);
  EXPECT_NEAR(RelativeL2Error(std::vector<float>{3, 4}, std::vector<float>{3, 4}), 0, 0);
  EXPECT_NEAR(RelativeL2Error(std::vector<float>{3, 5}, std::vector<float>{3, 4}), 1.0 / 5.0, 1e-7);
  EXPECT_TRUE(std::isinf(RelativeL2Error(std::vector<float>{1}, std::vector<float>{1, 2})));
}

// Per-case metrics from hand-made outputs: one case, none and lazy.
TEST(QualityMetricsTest, CaseMetricsByHand) {
  StoryDoc relevant, other;
  relevant.object_ids = {50};
  other.object_ids = {60, 61};
  const std::vector<StoryDoc> corpus = {relevant, other};
  QualityCase c;
  c.count = 2;
  c.doc_ids = {1, 0};
  c.control_ids = {1, 1};
  c.relevant_doc = 0;
  c.held_out = {50, 7, 8};
  c.answer_tokens = 2;
  RunResults results;
  results.per_case.resize(1);
  CaseSettingResult& none = results.per_case[0][kNone];
  none.ran = true;
  none.continuation.generated = {5, 50, 6, 2};
  none.continuation.logprobs = {std::log(0.5), std::log(0.25), std::log(0.5), std::log(1.0)};
  none.held_out.logprobs = {std::log(0.5), std::log(0.5), std::log(0.125)};
  none.held_out.top1 = {1, 1, 0};
  CaseSettingResult& lazy = results.per_case[0][kLazy];
  lazy.ran = true;
  lazy.continuation.generated = {5, 60, 61, 2};
  lazy.continuation.logprobs = {std::log(0.5), std::log(0.125), std::log(0.25), std::log(0.5)};
  lazy.held_out.logprobs = {std::log(0.25), std::log(0.5), std::log(0.5)};
  lazy.held_out.top1 = {1, 0, 1};
  const MetricsTable m = ComputeMetrics(corpus, {c}, results);
  const CaseMetrics& n = m[0][kNone];
  EXPECT_DOUBLE_EQ(n.agreement.prefix, 1);
  EXPECT_NEAR(n.ref_nll, (std::log(2.0) + std::log(4.0) + std::log(2.0)) / 4, 1e-12);
  EXPECT_NEAR(n.held_nll, (std::log(2.0) + std::log(2.0) + std::log(8.0)) / 3, 1e-12);
  EXPECT_TRUE(n.answer_correct);
  EXPECT_NEAR(n.answer_nll, 2 * std::log(2.0), 1e-12);
  EXPECT_TRUE(n.recalls_object);
  EXPECT_FALSE(n.wrong_object);
  const CaseMetrics& l = m[0][kLazy];
  EXPECT_DOUBLE_EQ(l.agreement.prefix, 0.25);  // against none's run: 5 equal, then 60 != 50
  EXPECT_DOUBLE_EQ(l.agreement.overall, 0.5);  // positions 0 and 3
  EXPECT_NEAR(l.ref_nll, (std::log(2.0) + std::log(8.0) + std::log(4.0) + std::log(2.0)) / 4, 1e-12);
  EXPECT_FALSE(l.answer_correct);
  EXPECT_NEAR(l.answer_nll, std::log(4.0) + std::log(2.0), 1e-12);
  EXPECT_FALSE(l.recalls_object);
  EXPECT_TRUE(l.wrong_object);
  EXPECT_FALSE(m[0][kBlock].ran);
}

class QualityEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveModel("stories260K.bin") || !HaveModel("tok512.bin")) GTEST_SKIP() << "no ../shared/models";
    auto weights = LoadLlama2cCheckpoint(ModelPath("stories260K.bin"));
    auto tokenizer = LoadTokenizer(ModelPath("tok512.bin"));
    ASSERT_TRUE(weights.ok() && tokenizer.ok());
    weights_ = *std::move(weights);
    tokenizer_ = *std::move(tokenizer);
    auto corpus = BuildCorpus(*tokenizer_, 16, 5);
    ASSERT_TRUE(corpus.ok()) << corpus.status();
    corpus_ = *std::move(corpus);
    auto cases = BuildCases(corpus_, *tokenizer_,
                            CaseOptions{.corpus_docs = 16, .counts = {1, 3}, .cases_per_group = 1, .seed = 5});
    ASSERT_TRUE(cases.ok()) << cases.status();
    cases_ = *std::move(cases);
  }

  ModelWeights weights_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::vector<StoryDoc> corpus_;
  std::vector<QualityCase> cases_;
};

TEST_F(QualityEngineTest, CasesAreGroundedInOneDocument) {
  ASSERT_EQ(cases_.size(), 4u);  // 1 doc; 3 docs with the relevant one first, middle, last
  EXPECT_EQ(cases_[2].relevant_slot, 1);
  for (const QualityCase& c : cases_) {
    EXPECT_EQ(c.doc_ids[c.relevant_slot], c.relevant_doc);
    EXPECT_NE(c.control_ids[c.relevant_slot], c.relevant_doc);
    EXPECT_GT(c.answer_tokens, 0);
    EXPECT_LT(c.answer_tokens, static_cast<int>(c.held_out.size()));
    for (int id : c.doc_ids) {
      if (id == c.relevant_doc) continue;
      EXPECT_NE(corpus_[id].color, corpus_[c.relevant_doc].color);
      EXPECT_NE(corpus_[id].object, corpus_[c.relevant_doc].object);
    }
  }
}

// Teacher forcing with restarts scores each token exactly as one request per position does.
TEST_F(QualityEngineTest, TeacherForcingEqualsOneRequestPerPosition) {
  for (AttentionMode mode : {AttentionMode::kNone, AttentionMode::kLazy}) {
    auto engine = MakeEngine(weights_, mode);
    const QualityCase& c = cases_[3];
    const std::vector<std::vector<int32_t>> docs = DocsOf(corpus_, c.doc_ids);
    ScoringJob job(ScoringJobSpec{.docs = docs,
                                  .prompt = c.prompt,
                                  .mode = mode,
                                  .restart_mode = mode,
                                  .free_run_tokens = 0,
                                  .score_free_run = false,
                                  .target = &c.held_out,
                                  .full_free_run = false,
                                  .sketch_ids = {}});
    ScoringJob* jobs[] = {&job};
    ASSERT_TRUE(RunJobs(*engine, jobs, 4).ok());
    ASSERT_EQ(job.output().logprobs.size(), c.held_out.size());
    for (size_t i = 0; i < c.held_out.size(); ++i) {
      GenerateRequest request;
      request.docs = docs;
      request.prompt = c.prompt;
      request.prompt.insert(request.prompt.end(), c.held_out.begin(), c.held_out.begin() + i);
      request.sampling.max_tokens = 1;
      request.record_logits = true;
      auto result = engine->Generate(request);
      ASSERT_TRUE(result.ok()) << result.status();
      EXPECT_NEAR(job.output().logprobs[i], LogProbOf(result->step_logits[0], c.held_out[i]), 1e-4)
          << AttentionModeName(mode) << " position " << i;
      EXPECT_EQ(job.output().top1[i] != 0, ArgMax(result->step_logits[0]) == c.held_out[i]);
    }
    ExpectNoLeakedBlocks(*engine);
  }
}

// A free run scored as its own target gets the log-probabilities the engine reported.
TEST_F(QualityEngineTest, FreeRunScoresMatchEngineLogprobs) {
  auto engine = MakeEngine(weights_, AttentionMode::kLazy);
  const QualityCase& c = cases_[2];
  ScoringJob job(ScoringJobSpec{.docs = DocsOf(corpus_, c.doc_ids),
                                .prompt = c.prompt,
                                .mode = AttentionMode::kLazy,
                                .restart_mode = AttentionMode::kLazy,
                                .free_run_tokens = 12,
                                .score_free_run = true,
                                .target = nullptr,
                                .full_free_run = true,
                                .sketch_ids = {}});
  ScoringJob* jobs[] = {&job};
  ASSERT_TRUE(RunJobs(*engine, jobs, 4).ok());
  GenerateRequest request;
  request.docs = DocsOf(corpus_, c.doc_ids);
  request.prompt = c.prompt;
  request.sampling.max_tokens = 12;
  request.sampling.temperature = 0;
  auto plain = engine->Generate(request);
  ASSERT_TRUE(plain.ok());
  ASSERT_GE(job.output().logprobs.size(), plain->tokens.size());
  for (size_t i = 0; i < plain->tokens.size(); ++i) {
    EXPECT_EQ(job.output().generated[i], plain->tokens[i]);
    EXPECT_NEAR(job.output().logprobs[i], plain->logprobs[i], 1e-4) << i;
    EXPECT_EQ(job.output().top1[i], 1);
  }
  EXPECT_EQ(job.output().requests, 1);
}

// The short form of the run on a trained model: prefix equals none exactly, lazy equals
// block, and one document alone is the same function in lazy as in none.
void ExpectShortRunHolds(const std::string& model, const std::string& tokenizer_file) {
  if (!HaveModel(model) || !HaveModel(tokenizer_file)) GTEST_SKIP() << "no ../shared/models/" << model;
  auto weights = LoadLlama2cCheckpoint(ModelPath(model));
  auto tokenizer = LoadTokenizer(ModelPath(tokenizer_file));
  ASSERT_TRUE(weights.ok() && tokenizer.ok());
  auto corpus = BuildCorpus(**tokenizer, 16, 5);
  ASSERT_TRUE(corpus.ok()) << corpus.status();
  auto cases = BuildCases(*corpus, **tokenizer,
                          CaseOptions{.corpus_docs = 16, .counts = {1, 3}, .cases_per_group = 1, .seed = 5});
  ASSERT_TRUE(cases.ok()) << cases.status();
  EngineOptions long_options;
  long_options.anchor = {weights->config.bos_id};
  for (int32_t t : (*tokenizer)->Encode("The sun was warm.")) long_options.anchor.push_back(t);
  auto bos = MakeEngine(*weights, EngineOptions{});
  auto with_long = MakeEngine(*weights, long_options);
  EngineOptions bare_options;
  bare_options.anchorless = true;
  auto bare = MakeEngine(*weights, bare_options);
  auto results = RunQuality({bos.get(), with_long.get(), bare.get()}, *corpus, *cases,
                            RunOptions{.free_run_tokens = 12,
                                       .max_in_flight = 8,
                                       .long_anchor = true,
                                       .anchorless = true,
                                       .sketch_size = 128,
                                       .check_every = 1,
                                       .seed = 5});
  ASSERT_TRUE(results.ok()) << results.status();
  const MetricsTable metrics = ComputeMetrics(*corpus, *cases, *results);
  const QualityChecks checks = RunChecks(*results, metrics);
  EXPECT_EQ(checks.prefix_vs_none.cases, 4);
  EXPECT_EQ(checks.prefix_vs_none.same_tokens, 4);
  EXPECT_LE(checks.prefix_vs_none.max_logit_rel_error, 1e-5);
  EXPECT_LE(checks.prefix_vs_none.max_logprob_diff, 1e-4);
  EXPECT_EQ(checks.lazy_vs_block.same_tokens, 4);
  EXPECT_LE(checks.lazy_vs_block.max_logit_rel_error, 1e-4);
  EXPECT_LE(checks.lazy_vs_block.max_logprob_diff, 1e-3);
  ASSERT_EQ((*cases)[0].count, 1);
  EXPECT_EQ(results->per_case[0][kLazy].continuation.generated, results->per_case[0][kNone].continuation.generated);
  EXPECT_EQ(results->per_case[0][kLazyLong].continuation.generated,
            results->per_case[0][kNoneLong].continuation.generated);
  // No anchor: one document alone is still the same function in lazy as in none (the held-out
  // text scored in lazy and in prefix mode), and it is not the BOS engine's function.
  const CaseSettingResult& bare_none = results->per_case[0][kNoneBare];
  const CaseSettingResult& bare_lazy = results->per_case[0][kLazyBare];
  EXPECT_EQ(bare_lazy.continuation.generated, bare_none.continuation.generated);
  ASSERT_EQ(bare_lazy.held_out.logprobs.size(), bare_none.held_out.logprobs.size());
  double bare_vs_bos = 0;
  for (size_t i = 0; i < bare_lazy.held_out.logprobs.size(); ++i) {
    EXPECT_NEAR(bare_lazy.held_out.logprobs[i], bare_none.held_out.logprobs[i], 1e-3) << i;
    bare_vs_bos = std::max(bare_vs_bos,
                           std::abs(bare_lazy.held_out.logprobs[i] - results->per_case[0][kLazy].held_out.logprobs[i]));
  }
  EXPECT_GT(bare_vs_bos, 1e-3) << "lazy+noanchor scored the held-out text exactly as lazy with BOS";
  // Several documents: lazy with no anchor is neither none with no anchor nor lazy with BOS.
  for (size_t c = 1; c < cases->size(); ++c) {
    const auto& row = results->per_case[c];
    EXPECT_NE(row[kLazyBare].held_out.logprobs, row[kNoneBare].held_out.logprobs) << c;
    EXPECT_NE(row[kLazyBare].held_out.logprobs, row[kLazy].held_out.logprobs) << c;
    EXPECT_NE(row[kNoneBare].held_out.logprobs, row[kNone].held_out.logprobs) << c;
  }
  // Repair: with one document nothing is repaired (lazy's free run exactly); with several,
  // each request recomputes K tokens of every document but the first (the documents here
  // are longer than 16 tokens), and K = 16 changes what lazy computes.
  EXPECT_EQ(results->per_case[0][kLazyRepair16].continuation.generated,
            results->per_case[0][kLazy].continuation.generated);
  EXPECT_EQ(results->per_case[0][kLazyRepair16].continuation.repaired_tokens, 0);
  for (size_t c = 1; c < cases->size(); ++c) {
    const auto& row = results->per_case[c];
    const int later_docs = (*cases)[c].count - 1;
    EXPECT_EQ(row[kLazyRepair4].continuation.repaired_tokens, 4 * later_docs) << c;
    EXPECT_EQ(row[kLazyRepair16].continuation.repaired_tokens, 16 * later_docs) << c;
    EXPECT_EQ(row[kLazyRepair16].continuation.computed_tokens, row[kLazy].continuation.computed_tokens) << c;
    EXPECT_NE(row[kLazyRepair16].held_out.logprobs, row[kLazy].held_out.logprobs) << c;
  }
  for (const auto& row : metrics) {
    for (int s = 0; s < kNumSettings; ++s) {
      ASSERT_TRUE(row[s].ran) << Settings()[s].name;
      EXPECT_TRUE(std::isfinite(row[s].held_nll));
      EXPECT_GT(row[s].held_tokens, 0);
    }
  }
  const std::string report = MarkdownReport(*cases, metrics, checks, *results, ReportContext{});
  EXPECT_NE(report.find("| lazy+long |"), std::string::npos);
  EXPECT_NE(report.find("| lazy+noanchor |"), std::string::npos);
  EXPECT_NE(report.find("No anchor against BOS"), std::string::npos);
  EXPECT_NE(report.find("| lazy+repair16 |"), std::string::npos);
  EXPECT_NE(report.find("### Repair"), std::string::npos);
  EXPECT_EQ(report.find("Not available"), std::string::npos);
  EXPECT_EQ(MetricsCsv(*cases, metrics).find("case,count,placement,setting"), 0u);
  ExpectNoLeakedBlocks(*bos);
  ExpectNoLeakedBlocks(*with_long);
  ExpectNoLeakedBlocks(*bare);
}

TEST(QualityShortRunTest, Stories260K) { ExpectShortRunHolds("stories260K.bin", "tok512.bin"); }
TEST(QualityShortRunTest, Stories15M) { ExpectShortRunHolds("stories15M.bin", "tok32000.bin"); }

}  // namespace
}  // namespace lazykv::testing
