// The gRPC replay against an in-process fake Generation service, which records what it
// receives and serves documents from a set of contents seen before: the requests carry
// the trace's tokens and settings, closed loops keep their concurrency, open loops their
// arrival times, errors are counted by code, compare --target writes its results, and
// --document-text sends each document as its own text, the same in every request.
#include "bench/load_replay.h"

#include <grpcpp/grpcpp.h>
#include <xxhash.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "bench/document_text.h"
#include "bench/load_compare.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "proto/generate.grpc.pb.h"
#include "tests/test_util.h"

namespace lazykv::testing {
namespace {

using Clock = std::chrono::steady_clock;

class FakeGeneration final : public v1::Generation::Service {
 public:
  int vocab_size = 512;
  std::atomic<int> token_delay_ms{2};
  std::set<std::string> fail_ids;  // answered RESOURCE_EXHAUSTED

  struct Seen {
    v1::GenerateRequest request;
    Clock::time_point arrival;
  };

  grpc::Status Tokenize(grpc::ServerContext*, const v1::TokenizeRequest*, v1::TokenizeResponse* response) override {
    response->set_vocab_size(vocab_size);
    response->set_max_context(4096);
    return grpc::Status::OK;
  }

  grpc::Status Generate(grpc::ServerContext* context, const v1::GenerateRequest* request,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) override {
    v1::Usage usage;
    {
      std::lock_guard lock(mu_);
      seen_.push_back({*request, Clock::now()});
      max_in_flight_ = std::max(max_in_flight_, ++in_flight_);
      if (fail_ids.contains(request->request_id())) {
        --in_flight_;
        return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "queue full");
      }
      for (const v1::Document& doc : request->documents()) {
        const auto& ids = doc.tokens().ids();
        const bool cached = !cache_.insert(std::vector<int32_t>(ids.begin(), ids.end())).second;
        usage.set_document_tokens(usage.document_tokens() + ids.size());
        (cached ? usage.set_document_cached_tokens(usage.document_cached_tokens() + ids.size())
                : usage.set_document_computed_tokens(usage.document_computed_tokens() + ids.size()));
      }
    }
    const int n = request->sampling().max_tokens();
    for (int i = 0; i < n && !context->IsCancelled(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(token_delay_ms.load()));
      v1::GenerateResponse delta;
      delta.mutable_delta()->add_token_ids(10 + i);
      writer->Write(delta);
    }
    {
      std::lock_guard lock(mu_);
      --in_flight_;
    }
    if (context->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
    v1::GenerateResponse done;
    done.mutable_done()->set_request_id(request->request_id());
    done.mutable_done()->set_finish_reason(v1::FINISH_REASON_LENGTH);
    done.mutable_done()->set_mode(request->mode().empty() ? "lazy" : request->mode());
    usage.set_completion_tokens(n);
    *done.mutable_done()->mutable_usage() = usage;
    done.mutable_done()->mutable_timings()->set_ttft_ms(1.5);
    writer->Write(done);
    return grpc::Status::OK;
  }

  std::vector<Seen> seen() {
    std::lock_guard lock(mu_);
    return seen_;
  }
  int max_in_flight() {
    std::lock_guard lock(mu_);
    return max_in_flight_;
  }

 private:
  std::mutex mu_;
  std::vector<Seen> seen_;
  std::set<std::vector<int32_t>> cache_;
  int in_flight_ = 0, max_in_flight_ = 0;
};

class LoadReplayTest : public ::testing::Test {
 protected:
  void Start() {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&fake_);
    server_ = builder.BuildAndStart();
    ASSERT_GT(port, 0);
    target_ = "127.0.0.1:" + std::to_string(port);
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
  }

  FakeGeneration fake_;
  std::unique_ptr<grpc::Server> server_;
  std::string target_;
};

std::vector<int32_t> Ids(const v1::TokenIds& t) { return {t.ids().begin(), t.ids().end()}; }

// The trace index a replayed request carries in its id ("trace-N").
int TraceIndex(const v1::GenerateRequest& request) {
  return std::stoi(request.request_id().substr(request.request_id().find('-') + 1));
}

TEST_F(LoadReplayTest, ClosedLoopSendsTheTraceAtItsConcurrency) {
  Start();
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(seed);
  const RagTrace trace = *GenerateTrace(TraceOptions{.num_docs = 10,
                                                     .docs_per_request = 3,
                                                     .num_requests = 30,
                                                     .doc_lengths = "uniform:5:20",
                                                     .question_tokens = 4,
                                                     .max_tokens = 5,
                                                     .concurrency = 3,
                                                     .seed = seed});
  auto run = ReplayTrace(trace, ReplayOptions{.target = target_, .mode = "block"});
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->worker_vocab_size, 512);
  EXPECT_EQ(fake_.max_in_flight(), 3);

  // Every request arrived once, as the trace has it.
  const auto seen = fake_.seen();
  ASSERT_EQ(seen.size(), trace.requests.size());
  std::set<std::string> ids;
  for (const auto& s : seen) {
    const v1::GenerateRequest& got = s.request;
    ids.insert(got.request_id());
    const int id = TraceIndex(got);
    const TraceRequest& want = trace.requests[id];
    ASSERT_EQ(got.documents_size(), 3);
    for (int d = 0; d < 3; ++d) EXPECT_EQ(Ids(got.documents(d).tokens()), trace.documents[want.doc_ids[d]]);
    EXPECT_EQ(Ids(got.prompt_tokens()), want.question);
    EXPECT_EQ(got.sampling().max_tokens(), 5);
    EXPECT_EQ(got.sampling().temperature(), 0);
    EXPECT_EQ(got.mode(), "block");
  }
  EXPECT_EQ(ids.size(), trace.requests.size());

  ASSERT_EQ(run->results.size(), trace.requests.size());
  for (size_t k = 0; k < run->results.size(); ++k) {
    const RequestResult& r = run->results[k];
    EXPECT_EQ(r.id, static_cast<int>(k));
    EXPECT_TRUE(r.ok()) << r.status << " " << r.error;
    EXPECT_EQ(r.tokens_received, 5);
    EXPECT_EQ(r.output_tokens, (std::vector<int32_t>{10, 11, 12, 13, 14}));
    ASSERT_EQ(r.itl_ms.size(), 4u);  // one gap per delta after the first
    // Single gaps shrink when the client reads late, but the last token cannot come before
    // the fake's five 2 ms sleeps: TTFT plus the gaps is when it came.
    double last_token_ms = r.ttft_ms;
    for (double gap : r.itl_ms) last_token_ms += gap;
    EXPECT_GE(r.ttft_ms, 1.9);
    EXPECT_GE(last_token_ms, 9.9);
    EXPECT_GE(r.total_ms, last_token_ms);
    EXPECT_EQ(r.mode, "block");
    EXPECT_EQ(r.finish_reason, "FINISH_REASON_LENGTH");
    EXPECT_EQ(r.server_ttft_ms, 1.5);
  }
  // The fake computes each distinct content once, so fleet compute is exactly 1.
  const LoadSummary s = SummarizeRun(run->results, run->wall_s, DistinctDocumentTokens(trace));
  EXPECT_EQ(s.succeeded, 30);
  EXPECT_EQ(s.fleet_compute, 1.0);
  int64_t requested = 0;
  for (const TraceRequest& r : trace.requests) {
    for (int d : r.doc_ids) requested += static_cast<int64_t>(trace.documents[d].size());
  }
  EXPECT_DOUBLE_EQ(s.hit_ratio, 1.0 - static_cast<double>(DistinctDocumentTokens(trace)) / requested);
  EXPECT_EQ(s.usage.completion_tokens, 30 * 5);
}

constexpr uint64_t kDocumentText3Hash = 0xd05c771421fc9be9ULL;  // XXH64 of DocumentText(3, 300)

TEST_F(LoadReplayTest, DocumentTextSendsEachDocumentAsItsOwnText) {
  Start();
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(seed);
  const RagTrace trace = *GenerateTrace(TraceOptions{.num_docs = 6,
                                                     .docs_per_request = 3,
                                                     .num_requests = 12,
                                                     .doc_lengths = "fixed:8",
                                                     .question_tokens = 4,
                                                     .max_tokens = 1,
                                                     .concurrency = 2,
                                                     .seed = seed});
  auto run = ReplayTrace(trace, ReplayOptions{.target = target_, .document_text_bytes = 300});
  ASSERT_TRUE(run.ok()) << run.status();
  for (const RequestResult& r : run->results) EXPECT_TRUE(r.ok()) << r.status << " " << r.error;
  ASSERT_EQ(fake_.seen().size(), trace.requests.size());
  std::map<int, std::string> text_of;  // document id -> the text it went as
  std::set<std::string> texts;
  for (const auto& s : fake_.seen()) {
    const v1::GenerateRequest& got = s.request;
    const TraceRequest& want = trace.requests[TraceIndex(got)];
    ASSERT_EQ(got.documents_size(), 3);
    EXPECT_EQ(Ids(got.prompt_tokens()), want.question) << "the question still goes as ids";
    for (int d = 0; d < 3; ++d) {
      ASSERT_EQ(got.documents(d).content_case(), v1::Document::kText);
      const std::string& text = got.documents(d).text();
      EXPECT_GE(text.size(), 300u);
      EXPECT_LT(text.size(), 330u);
      auto [it, fresh] = text_of.emplace(want.doc_ids[d], text);
      EXPECT_EQ(it->second, text) << "document " << want.doc_ids[d] << " went as another text";
      texts.insert(text);
    }
  }
  EXPECT_EQ(texts.size(), text_of.size()) << "two documents went as the same text";
  // The same text in every run and build (results of different sessions compare): its hash
  // when this test was written.
  const std::string text3 = DocumentText(3, 300);
  EXPECT_EQ(XXH64(text3.data(), text3.size(), 0), kDocumentText3Hash) << text3;
}

TEST_F(LoadReplayTest, OpenLoopKeepsTheArrivalTimes) {
  Start();
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(seed);
  // 40 req/s with requests of ~10 ms: mostly one in flight, sometimes more.
  const RagTrace trace = *GenerateTrace(TraceOptions{.num_docs = 10,
                                                     .docs_per_request = 2,
                                                     .num_requests = 20,
                                                     .doc_lengths = "fixed:8",
                                                     .max_tokens = 5,
                                                     .rate = 40,
                                                     .seed = seed});
  auto run = ReplayTrace(trace, ReplayOptions{.target = target_});
  ASSERT_TRUE(run.ok()) << run.status();
  const auto seen = fake_.seen();
  ASSERT_EQ(seen.size(), 20u);
  Clock::time_point first = seen[0].arrival;
  for (const auto& s : seen) first = std::min(first, s.arrival);
  std::map<std::string, double> server_offset;  // seconds after the first arrival, by request id
  for (const auto& s : seen)
    server_offset[s.request.request_id()] = std::chrono::duration<double>(s.arrival - first).count();
  for (size_t k = 0; k < 20; ++k) {
    const RequestResult& r = run->results[k];
    EXPECT_NEAR(r.scheduled_s, trace.requests[k].arrival_s, 1e-3);
    EXPECT_GE(r.sent_s, r.scheduled_s);
    EXPECT_LT(r.sent_s - r.scheduled_s, 0.05);
    // The server saw the same spacing as the trace (within scheduling noise).
    const double want = trace.requests[k].arrival_s - trace.requests[0].arrival_s;
    EXPECT_NEAR(server_offset["trace-" + std::to_string(k)], want, 0.05) << k;
    EXPECT_EQ(r.mode, "lazy");  // no override: the worker's own mode
  }
  EXPECT_GE(run->wall_s, trace.requests.back().arrival_s);
}

TEST_F(LoadReplayTest, ErrorsAreCountedByCode) {
  fake_.fail_ids = {"trace-0", "trace-3", "trace-7"};
  Start();
  const RagTrace trace = *GenerateTrace(TraceOptions{.num_docs = 5,
                                                     .docs_per_request = 2,
                                                     .num_requests = 10,
                                                     .doc_lengths = "fixed:4",
                                                     .max_tokens = 3,
                                                     .concurrency = 2,
                                                     .seed = FreshSeed()});
  auto run = ReplayTrace(trace, ReplayOptions{.target = target_});
  ASSERT_TRUE(run.ok()) << run.status();
  const LoadSummary s = SummarizeRun(run->results, run->wall_s, DistinctDocumentTokens(trace));
  EXPECT_EQ(s.succeeded, 7);
  EXPECT_EQ(s.errors, (std::map<std::string, int64_t>{{"RESOURCE_EXHAUSTED", 3}}));
  EXPECT_EQ(run->results[3].error, "queue full");

  // A deadline shorter than a request: every one ends DEADLINE_EXCEEDED.
  fake_.token_delay_ms = 100;
  fake_.fail_ids.clear();
  auto late = ReplayTrace(trace, ReplayOptions{.target = target_, .deadline_ms = 30});
  ASSERT_TRUE(late.ok()) << late.status();
  const LoadSummary l = SummarizeRun(late->results, late->wall_s, 1);
  EXPECT_EQ(l.errors, (std::map<std::string, int64_t>{{"DEADLINE_EXCEEDED", 10}}));
}

TEST_F(LoadReplayTest, RefusesATraceBeyondTheVocabulary) {
  fake_.vocab_size = 100;
  Start();
  const RagTrace trace = *GenerateTrace(TraceOptions{.num_docs = 5,
                                                     .docs_per_request = 2,
                                                     .num_requests = 3,
                                                     .doc_lengths = "fixed:4",
                                                     .vocab_size = 512,
                                                     .seed = FreshSeed()});
  auto run = ReplayTrace(trace, ReplayOptions{.target = target_});
  ASSERT_EQ(run.status().code(), absl::StatusCode::kFailedPrecondition) << run.status();
  EXPECT_NE(run.status().message().find("--vocab 100"), std::string::npos) << run.status();
  EXPECT_TRUE(fake_.seen().empty());
}

bool HaveMatplotlib() { return std::system("/usr/bin/python3 -c 'import matplotlib' 2>/dev/null") == 0; }

TEST_F(LoadReplayTest, CompareOnATargetWritesEveryMode) {
  Start();
  const RagTrace trace = *GenerateTrace(TraceOptions{.num_docs = 6,
                                                     .docs_per_request = 2,
                                                     .num_requests = 8,
                                                     .doc_lengths = "fixed:4",
                                                     .max_tokens = 3,
                                                     .concurrency = 2,
                                                     .seed = FreshSeed()});
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("load_replay_test_" + std::to_string(FreshSeed()))).string();
  CompareOptions o;
  o.target = target_;
  o.modes = {"lazy", "none"};
  o.out_dir = dir;
  o.plot_script = LAZYKV_PLOT_SCRIPT;
  ASSERT_TRUE(RunCompare(trace, o).ok());
  std::ifstream in(dir + "/compare.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  ASSERT_EQ(j["modes"].size(), 2u);
  EXPECT_EQ(j["trace_options"]["requests"], 8);
  for (int m = 0; m < 2; ++m) {
    const std::string mode = o.modes[m];
    EXPECT_EQ(j["modes"][m]["mode"], mode);
    EXPECT_EQ(j["modes"][m]["summary"]["modes_served"][mode], 8);  // the override reached the server
    EXPECT_EQ(j["modes"][m]["requests"].size(), 8u);
  }
  // Shared state on one target: the second mode finds every document cached.
  EXPECT_EQ(j["modes"][1]["summary"]["hit_ratio"], 1.0);
  if (HaveMatplotlib()) {
    EXPECT_TRUE(std::filesystem::exists(dir + "/compare.png"));
  } else {
    std::cout << "skipped the plot check: /usr/bin/python3 cannot import matplotlib\n";
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace lazykv::testing
