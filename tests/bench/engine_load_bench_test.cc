// The loaded, batched benchmark's core loop (bench/engine_load_bench.h) on the CPU
// backend with synthetic:tiny: every mode answers every request in full, lazy and block
// compute and reuse the same prompt tokens, batched greedy outputs equal each request run
// alone, and a pool that holds few block-mode requests caps block's batch below lazy's.
#include "bench/engine_load_bench.h"

#include <fstream>
#include <set>

#include "bench/engine_load_report.h"
#include "gtest/gtest.h"
#include "tests/engine/engine_test_util.h"
#include "worker/backend/cpu_backend.h"
#include "worker/model/synthetic_model.h"

namespace lazykv::testing {
namespace {

constexpr int kBlockSize = 8;
constexpr int kMaxTokens = 5;

class EngineLoadBenchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    weights_ = MakeSyntheticWeights(*SyntheticConfig("tiny"), /*seed=*/11);
    TraceOptions options;
    options.num_docs = 12;
    options.docs_per_request = 4;
    options.zipf_s = 1.1;
    options.num_requests = 16;
    options.doc_lengths = "fixed:32";
    options.question_tokens = 4;
    options.max_tokens = kMaxTokens;
    options.vocab_size = weights_.config.vocab_size;
    options.seed = 5;
    auto trace = GenerateTrace(options);
    ASSERT_TRUE(trace.ok()) << trace.status();
    trace_ = *std::move(trace);
  }

  std::unique_ptr<Backend> MakeBackend(int num_blocks) {
    auto backend = CreateCpuBackend(weights_, kBlockSize, num_blocks);
    EXPECT_TRUE(backend.ok()) << backend.status();
    return *std::move(backend);
  }

  // The worst-case blocks admission reserves for the trace's first request in `mode`.
  int WorstCaseBlocks(AttentionMode mode) {
    auto engine = Engine::Create(MakeBackend(4096), EngineOptions{.mode = mode,
                                                                  .anchor = {},
                                                                  .max_prefill_tokens = 512,
                                                                  .max_queued_requests = 64,
                                                                  .tier = nullptr,
                                                                  .pipeline = {}});
    EXPECT_TRUE(engine.ok()) << engine.status();
    return (*engine)->ReservedBlocks(TraceToRequests(trace_)[0]);
  }

  ModelWeights weights_;
  RagTrace trace_;
};

TEST_F(EngineLoadBenchTest, EveryModeAnswersInFullAndLazyMatchesBlockAndRequestsAlone) {
  auto backend = MakeBackend(4096);  // room for every chunk: nothing is evicted
  // Closed loop at 6 with small prefill pieces: batches mix prefill and decode.
  const LoadOptions load{
      .request_rate = std::numeric_limits<double>::infinity(), .max_concurrency = 6, .max_prefill_tokens = 40};
  const std::vector<AttentionMode> modes = {AttentionMode::kNone, AttentionMode::kPrefix, AttentionMode::kBlock,
                                            AttentionMode::kLazy};
  auto results = RunModesUnderLoad(*backend, trace_, modes, load);
  ASSERT_TRUE(results.ok()) << results.status();
  ASSERT_EQ(results->size(), modes.size());

  const std::vector<GenerateRequest> requests = TraceToRequests(trace_);
  // Anchor once, each distinct document once, every question.
  std::set<int> distinct_docs;
  int64_t expected_computed = 1;
  for (const TraceRequest& r : trace_.requests) {
    distinct_docs.insert(r.doc_ids.begin(), r.doc_ids.end());
    expected_computed += static_cast<int64_t>(r.question.size());
  }
  for (int d : distinct_docs) expected_computed += static_cast<int64_t>(trace_.documents[d].size());

  std::map<AttentionMode, const ModeLoadResult*> by_mode;
  for (const ModeLoadResult& r : *results) {
    SCOPED_TRACE(AttentionModeName(r.mode));
    by_mode[r.mode] = &r;
    EXPECT_EQ(r.completed, 16);
    EXPECT_EQ(r.failed, 0) << r.first_error;
    EXPECT_EQ(r.output_tokens, 16 * kMaxTokens);
    for (const auto& tokens : r.tokens) EXPECT_EQ(tokens.size(), static_cast<size_t>(kMaxTokens));
    EXPECT_EQ(r.cached_tokens + r.computed_tokens, r.prompt_tokens);
    EXPECT_EQ(r.ttft_ms.count, 16);
    EXPECT_GT(r.request_throughput, 0);
    EXPECT_LE(r.max_running, 6);   // the concurrency cap
    EXPECT_GT(r.max_decoding, 1);  // requests decoded together
    EXPECT_EQ(r.max_queued, 0);    // the pool held every request the loop sent
    EXPECT_EQ(r.evictions, 0u);
  }
  const ModeLoadResult& none = *by_mode[AttentionMode::kNone];
  const ModeLoadResult& block = *by_mode[AttentionMode::kBlock];
  const ModeLoadResult& lazy = *by_mode[AttentionMode::kLazy];
  EXPECT_EQ(none.cached_tokens, 0);
  EXPECT_EQ(lazy.computed_tokens, expected_computed);
  EXPECT_EQ(block.computed_tokens, lazy.computed_tokens);
  EXPECT_EQ(block.cached_tokens, lazy.cached_tokens);
  EXPECT_GT(lazy.cached_tokens, 0);
  EXPECT_EQ(lazy.kv_bytes_copied, 0u);
  EXPECT_GT(block.kv_bytes_copied, 0u);

  // Greedy: each request's tokens under load equal the same request alone on a fresh engine.
  for (AttentionMode mode : {AttentionMode::kLazy, AttentionMode::kBlock, AttentionMode::kNone}) {
    for (size_t i = 0; i < requests.size(); ++i) {
      SCOPED_TRACE(::testing::Message() << AttentionModeName(mode) << " request " << i);
      auto alone = MakeEngine(weights_, mode, kBlockSize)->Generate(requests[i]);
      ASSERT_TRUE(alone.ok()) << alone.status();
      EXPECT_EQ(by_mode[mode]->tokens[i], alone->tokens);
    }
  }

  const std::string table = FormatLoadTable(*results);
  EXPECT_NE(table.find("lazy"), std::string::npos) << table;
  EXPECT_NE(FormatLazyBlockRatios(*results).find("lazy over block"), std::string::npos);
  const nlohmann::json json = LoadRunToJson(*results, {{"model", "synthetic:tiny"}});
  ASSERT_EQ(json["modes"].size(), modes.size());
  EXPECT_EQ(json["modes"][3]["mode"], "lazy");
  EXPECT_TRUE(json.contains("lazy_over_block"));
}

TEST_F(EngineLoadBenchTest, APoolHoldingFewBlockRequestsCapsBlocksBatchBelowLazys) {
  const int block_worst = WorstCaseBlocks(AttentionMode::kBlock);
  const int lazy_worst = WorstCaseBlocks(AttentionMode::kLazy);
  ASSERT_GT(block_worst, lazy_worst);                        // block reserves its private copies too
  const int num_blocks = 2 * block_worst + block_worst / 2;  // two block-mode requests fit
  ASSERT_GE(num_blocks / lazy_worst, 3) << "the test needs documents longer against the rest";
  auto backend = MakeBackend(num_blocks);
  // Every request at once: only the pool limits the batch.
  const LoadOptions load{
      .request_rate = std::numeric_limits<double>::infinity(), .max_concurrency = 0, .max_prefill_tokens = 512};
  auto results = RunModesUnderLoad(*backend, trace_, {AttentionMode::kBlock, AttentionMode::kLazy}, load);
  ASSERT_TRUE(results.ok()) << results.status();
  const ModeLoadResult& block = (*results)[0];
  const ModeLoadResult& lazy = (*results)[1];
  for (const ModeLoadResult& r : *results) {
    SCOPED_TRACE(AttentionModeName(r.mode));
    EXPECT_EQ(r.completed, 16);
    EXPECT_EQ(r.failed, 0) << r.first_error;
    EXPECT_EQ(r.output_tokens, 16 * kMaxTokens);
    EXPECT_LE(r.peak_blocks_reserved, num_blocks);
    // Shared documents are reserved once, so more than the share-nothing count may run.
    EXPECT_GE(r.max_running, r.worst_case_requests_fit);
  }
  EXPECT_GT(block.max_queued, 0);  // block's requests waited for pool room (lazy's may all fit)
  EXPECT_EQ(block.worst_case_requests_fit, 2);
  EXPECT_EQ(lazy.worst_case_requests_fit, num_blocks / lazy_worst);
  EXPECT_LT(block.max_running, lazy.max_running);
  EXPECT_LT(block.max_decoding, lazy.max_decoding);
  EXPECT_LT(block.mean_running, lazy.mean_running);
  EXPECT_NE(FormatLoadCapacity(*results, kBlockSize, backend->kv_bytes_per_block()).find("block"), std::string::npos);
}

TEST_F(EngineLoadBenchTest, PoissonArrivalsPaceTheRunAndBadOptionsAreRefused) {
  auto backend = MakeBackend(4096);
  // 400 requests/s: about 40 ms for the 16; an idle engine waits for the next arrival.
  const LoadOptions load{.request_rate = 400, .max_concurrency = 0, .max_prefill_tokens = 512};
  const std::string json_path = ::testing::TempDir() + "/engine_load_bench_test.json";
  const absl::Status reported =
      RunModesAndReport(*backend, trace_, {AttentionMode::kLazy}, load, {{"model", "synthetic:tiny"}}, json_path);
  ASSERT_TRUE(reported.ok()) << reported;
  std::ifstream file(json_path);
  const nlohmann::json report = nlohmann::json::parse(file, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(report.is_discarded());
  EXPECT_EQ(report["setup"]["model"], "synthetic:tiny");
  EXPECT_GT(report["setup"]["host_greedy_sample_ms"].get<double>(), 0);
  ASSERT_EQ(report["modes"].size(), 1u);
  const nlohmann::json& lazy = report["modes"][0];
  EXPECT_EQ(lazy["completed"], 16);
  EXPECT_GT(lazy["duration_s"].get<double>(), 0.01);  // the arrivals, not the compute, set the pace
  EXPECT_FALSE(RunEngineLoad(*MakeEngine(weights_, AttentionMode::kLazy), trace_,
                             LoadOptions{.request_rate = 0, .max_concurrency = 1, .max_prefill_tokens = 512})
                   .ok());
}

}  // namespace
}  // namespace lazykv::testing
