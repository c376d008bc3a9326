// lazykv-worker over gRPC on loopback: the real binary (and a real cache server),
// checked against the in-process engine. Streaming order and completeness, usage that
// adds up, lazy = block outputs, bad input, cancellation and deadlines freeing blocks,
// admission, two workers computing each document once fleet-wide, and SIGTERM.
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <chrono>
#include <fstream>
#include <future>
#include <numeric>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/monotonic_clock.h"
#include "gtest/gtest.h"
#include "proto/generate.grpc.pb.h"
#include "tests/cache_server/cache_test_util.h"
#include "tests/test_util.h"
#include "worker/setup/model_setup.h"

namespace lazykv::testing {
namespace {

// `grace_ms`: the worker's --shutdown-grace-ms before scaling by SlowdownFactor().
std::unique_ptr<ServerProcess> StartWorker(const std::string& dir, std::vector<std::string> flags,
                                           int grace_ms = 2000) {
  std::vector<std::string> args = {"--listen",    "127.0.0.1:0",         "--metrics-listen",
                                   "127.0.0.1:0", "--shutdown-grace-ms", std::to_string(grace_ms * SlowdownFactor())};
  args.insert(args.end(), flags.begin(), flags.end());
  auto worker = std::make_unique<ServerProcess>(LAZYKV_WORKER, args, dir + "/worker.log");
  EXPECT_TRUE(worker->started()) << "see " << dir << "/worker.log";
  return worker;
}

std::vector<std::string> StoriesFlags(const std::string& dir) {
  return {"--model",     ModelPath("stories260K.bin"), "--tokenizer", ModelPath("tok512.bin"), "--cache-dir",
          dir + "/cache"};
}

std::unique_ptr<v1::Generation::Stub> Stub(const std::string& address) {
  return v1::Generation::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

struct Reply {
  grpc::Status status;
  std::vector<v1::GenerateResponse> messages;
  std::vector<int32_t> tokens;
  std::string text;
  v1::GenerateDone done;
};

// `after_first_token` runs once the first delta has arrived (cancellation tests).
Reply Call(v1::Generation::Stub& stub, const v1::GenerateRequest& request, int deadline_ms = 60000,
           const std::function<void(grpc::ClientContext&)>& after_first_token = nullptr) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(deadline_ms));
  auto reader = stub.Generate(&context, request);
  Reply reply;
  v1::GenerateResponse message;
  while (reader->Read(&message)) {
    reply.messages.push_back(message);
    if (message.has_delta()) {
      reply.tokens.insert(reply.tokens.end(), message.delta().token_ids().begin(), message.delta().token_ids().end());
      reply.text += message.delta().text();
      if (after_first_token && reply.tokens.size() == 1) after_first_token(context);
    }
    if (message.has_done()) reply.done = message.done();
  }
  reply.status = reader->Finish();
  return reply;
}

v1::GenerateRequest TextRequest(const std::vector<std::string>& docs, const std::string& prompt, int max_tokens) {
  v1::GenerateRequest request;
  for (const std::string& doc : docs) request.add_documents()->set_text(doc);
  request.set_prompt_text(prompt);
  request.mutable_sampling()->set_max_tokens(max_tokens);
  return request;
}

// Waits until the worker holds no running request; returns its metrics page then.
// The page once no request runs and none holds a reservation, or after 2 s (a leak then
// shows in the page). Both are asked: the engine's gauges are set one after another after a
// step, so a scrape in between can read the new running count beside the old reservation
// (running 0 with 9 blocks reserved failed CI once).
std::string MetricsWhenIdle(const ServerProcess& worker) {
  std::string page;
  for (int i = 0; i < 200; ++i) {
    page = HttpGet(worker.metrics_address(), "/metrics");
    if (Metric(page, "lazykv_worker_running_requests") == 0 && Metric(page, "lazykv_worker_kv_blocks_reserved") == 0) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return page;
}

// MetricsWhenIdle, then until the page counts `total` requests ended with one of `outcomes`
// (an ended request is counted when the engine's next step reports it, which may come after
// its blocks are freed), or 2 s pass.
std::string MetricsWhenCounted(const ServerProcess& worker, const std::vector<std::string>& outcomes, double total) {
  std::string page = MetricsWhenIdle(worker);
  auto counted = [&] {
    double sum = 0;
    for (const std::string& o : outcomes) {
      sum += std::max(0.0, Metric(page, "lazykv_worker_requests_total{outcome=\"" + o + "\"}"));
    }
    return sum;
  };
  for (int i = 0; i < 200 && counted() < total; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10) * SlowdownFactor());
    page = HttpGet(worker.metrics_address(), "/metrics");
  }
  return page;
}

void ExpectNoBlocksHeldByRequests(const std::string& page) {
  EXPECT_EQ(Metric(page, "lazykv_worker_running_requests"), 0);
  EXPECT_EQ(Metric(page, "lazykv_worker_kv_blocks_reserved"), 0);
  // Every used block is the pool index's (reusable KV), none a request's.
  EXPECT_EQ(Metric(page, "lazykv_worker_kv_blocks{state=\"used\"}"),
            Metric(page, "lazykv_worker_kv_blocks{state=\"cached\"}"));
}

const std::vector<std::string> kDocs = {
    "Lily had a big red ball. She liked to throw it high in the sky and catch it.",
    "Tom was a little dog who lived in a small house near the park with his friend Sam.",
    "One day the sun was hot, so Lily and her mom went to the beach to swim in the sea.",
};

TEST(WorkerServerTest, StreamsInOrderAndMatchesTheInProcessEngine) {
  if (!HaveModel("stories260K.bin") || !HaveModel("tok512.bin")) GTEST_SKIP() << "no stories260K in ../shared/models";
  const std::string dir = TempDir("worker_stream");
  // With the start-up calibration and transfer warm-up forced on (off by default on the
  // CPU): they must leave nothing behind that changes an output.
  std::vector<std::string> flags = StoriesFlags(dir);
  flags.insert(flags.end(), {"--calibrate-prefill-tokens", "64"});
  auto worker = StartWorker(dir, flags);
  auto stub = Stub(worker->address());
  {
    std::ifstream log(dir + "/worker.log");
    const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
    EXPECT_NE(text.find("prefill calibration: 128 tokens"), std::string::npos) << text;  // 2 x 64
    EXPECT_EQ(text.find("warm-up failed"), std::string::npos) << text;
  }
  ModelSetupOptions setup;
  setup.model = ModelPath("stories260K.bin");
  setup.tokenizer = ModelPath("tok512.bin");
  setup.cache_tier.enabled = false;
  auto local = SetUpEngine(setup);
  ASSERT_TRUE(local.ok()) << local.status();

  const std::vector<std::vector<int>> orders = {{0, 1, 2}, {2, 0, 1}, {1, 2, 0}};
  int streamed_total = 0;  // tokens the calls received
  for (size_t i = 0; i < orders.size(); ++i) {
    std::vector<std::string> docs;
    for (int d : orders[i]) docs.push_back(kDocs[d]);
    GenerateRequest expected_request;
    for (const std::string& doc : docs) expected_request.docs.push_back(local->tokenizer->Encode(doc));
    expected_request.prompt = local->tokenizer->Encode("Once upon a time");
    expected_request.sampling.max_tokens = 30;
    auto expected = local->engine->Generate(expected_request);
    ASSERT_TRUE(expected.ok()) << expected.status();

    for (const std::string mode : {"lazy", "block"}) {
      SCOPED_TRACE(absl::StrCat("request ", i, " mode ", mode));
      v1::GenerateRequest request = TextRequest(docs, "Once upon a time", 30);
      request.set_request_id(absl::StrCat("r", i, mode));
      request.set_mode(mode);
      const int64_t sent_ns = MonotonicNanos();
      const Reply reply = Call(*stub, request);
      const int64_t received_ns = MonotonicNanos();
      ASSERT_TRUE(reply.status.ok()) << reply.status.error_message();
      streamed_total += static_cast<int>(reply.tokens.size());
      // Deltas (one token each), then exactly one final message, last.
      ASSERT_GE(reply.messages.size(), 2u);
      for (size_t m = 0; m + 1 < reply.messages.size(); ++m) ASSERT_TRUE(reply.messages[m].has_delta()) << m;
      ASSERT_TRUE(reply.messages.back().has_done());
      EXPECT_EQ(reply.tokens, expected->tokens);
      EXPECT_EQ(reply.text, DecodeContinuation(*local->tokenizer, expected->prompt_token_ids, expected->tokens));
      const v1::GenerateDone& done = reply.done;
      EXPECT_EQ(done.request_id(), request.request_id());
      EXPECT_EQ(done.mode(), mode);
      EXPECT_EQ(done.finish_reason(),
                expected->finish_reason == "stop" ? v1::FINISH_REASON_STOP : v1::FINISH_REASON_LENGTH);
      const v1::Usage& u = done.usage();
      EXPECT_EQ(u.prompt_tokens(), static_cast<int>(expected->prompt_token_ids.size()));
      EXPECT_EQ(u.pool_tokens() + u.host_tokens() + u.disk_tokens() + u.remote_tokens() + u.computed_tokens(),
                u.prompt_tokens());
      EXPECT_EQ(u.document_cached_tokens() + u.document_computed_tokens(), u.document_tokens());
      EXPECT_EQ(u.completion_tokens(), static_cast<int>(reply.tokens.size()));
      EXPECT_LE(done.timings().ttft_ms(), done.timings().total_ms());
      EXPECT_GE(done.timings().queue_ms(), 0);
      // The host's monotonic clock at the handler's first line, its first token and that token's
      // Write: in order, within the call as the client saw it, after the engine's first token.
      const int64_t arrival_ns = done.timings().arrival_monotonic_ns(),
                    first_write_ns = done.timings().first_write_monotonic_ns();
      EXPECT_LT(sent_ns, arrival_ns);
      const int64_t in_handler_ns = done.timings().first_token_in_handler_monotonic_ns();
      EXPECT_LE(arrival_ns + static_cast<int64_t>(done.timings().ttft_ms() * 1e6), in_handler_ns);
      EXPECT_LE(in_handler_ns, first_write_ns);
      EXPECT_LT(first_write_ns, received_ns);
      if (i > 0) {
        // Every document was seen before: all reused; lazy moves no KV, block copies.
        EXPECT_EQ(u.document_cached_tokens(), u.document_tokens());
        if (std::string(mode) == "lazy") {
          EXPECT_EQ(u.kv_bytes_copied(), 0u);
        } else {
          EXPECT_GT(u.kv_bytes_copied(), 0u);
        }
      }
    }
  }
  // The repair through the API: the same tokens as the in-process engine with it, its cost in
  // usage apart from computed_tokens (the sum of sources still adds up).
  {
    const std::vector<std::string> docs = {kDocs[2], kDocs[0], kDocs[1]};
    GenerateRequest expected_request;
    for (const std::string& doc : docs) expected_request.docs.push_back(local->tokenizer->Encode(doc));
    expected_request.prompt = local->tokenizer->Encode("Once upon a time");
    expected_request.sampling.max_tokens = 30;
    expected_request.repair_tokens = 6;
    auto expected = local->engine->Generate(expected_request);
    ASSERT_TRUE(expected.ok()) << expected.status();
    ASSERT_EQ(expected->usage.repaired_tokens, 12);
    v1::GenerateRequest request = TextRequest(docs, "Once upon a time", 30);
    request.set_mode("lazy");
    request.set_repair_tokens(6);
    const Reply reply = Call(*stub, request);
    ASSERT_TRUE(reply.status.ok()) << reply.status.error_message();
    streamed_total += static_cast<int>(reply.tokens.size());
    EXPECT_EQ(reply.tokens, expected->tokens);
    const v1::Usage& u = reply.done.usage();
    EXPECT_EQ(u.repaired_tokens(), 12);
    EXPECT_EQ(u.pool_tokens() + u.host_tokens() + u.disk_tokens() + u.remote_tokens() + u.computed_tokens(),
              u.prompt_tokens());
  }
  // A stop string ends the text before it, with finish reason STOP.
  const Reply full = Call(*stub, TextRequest({kDocs[0]}, "Once upon a time", 40));
  ASSERT_TRUE(full.status.ok());
  const size_t period = full.text.find('.');
  ASSERT_NE(period, std::string::npos) << full.text;
  v1::GenerateRequest stop_request = TextRequest({kDocs[0]}, "Once upon a time", 40);
  stop_request.mutable_sampling()->add_stop(".");
  const Reply stopped = Call(*stub, stop_request);
  ASSERT_TRUE(stopped.status.ok());
  streamed_total += static_cast<int>(full.tokens.size() + stopped.tokens.size());
  EXPECT_EQ(stopped.text, full.text.substr(0, period));
  EXPECT_EQ(stopped.done.finish_reason(), v1::FINISH_REASON_STOP);
  EXPECT_LT(stopped.tokens.size(), full.tokens.size());

  // Tokenize agrees with the tokenizer, and the health service answers.
  grpc::ClientContext context;
  v1::TokenizeRequest tokenize;
  tokenize.set_text(kDocs[1]);
  v1::TokenizeResponse tokens;
  ASSERT_TRUE(stub->Tokenize(&context, tokenize, &tokens).ok());
  EXPECT_EQ(std::vector<int32_t>(tokens.ids().begin(), tokens.ids().end()), local->tokenizer->Encode(kDocs[1]));
  EXPECT_EQ(tokens.vocab_size(), 512);
  const std::string page = MetricsWhenIdle(*worker);
  EXPECT_EQ(Metric(page, "lazykv_worker_requests_total{outcome=\"OK\"}"), 9);
  // What clients received: not the tokens in flight when the stop string matched.
  EXPECT_EQ(Metric(page, "lazykv_worker_generated_tokens_total"), streamed_total);
  EXPECT_GT(Metric(page, "lazykv_worker_ttft_seconds_count"), 0);
  EXPECT_GT(Metric(page, "lazykv_worker_inter_token_seconds_count"), 0);
  EXPECT_GT(Metric(page, "lazykv_worker_prompt_tokens_total{source=\"gpu\"}"), 0);
  ExpectNoBlocksHeldByRequests(page);
  stub.reset();
  EXPECT_EQ(worker->Stop(SIGTERM), 0);
}

TEST(WorkerServerTest, BadInputGetsInvalidArgumentNamingTheFieldAndTheWorkerGoesOn) {
  if (!HaveModel("stories260K.bin") || !HaveModel("tok512.bin")) GTEST_SKIP() << "no stories260K in ../shared/models";
  const std::string dir = TempDir("worker_bad");
  std::vector<std::string> flags = StoriesFlags(dir);
  flags.insert(flags.end(), {"--kv-pool", "256KiB", "--max-text-bytes", "4KiB"});  // 12 blocks of 16 tokens
  auto worker = StartWorker(dir, flags);
  auto stub = Stub(worker->address());
  int invalid = 0;
  auto expect_invalid = [&](const v1::GenerateRequest& request, const std::string& needle) {
    ++invalid;
    const Reply reply = Call(*stub, request);
    EXPECT_EQ(reply.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << needle;
    EXPECT_NE(reply.status.error_message().find(needle), std::string::npos) << reply.status.error_message();
    EXPECT_TRUE(reply.messages.empty());
  };
  expect_invalid(v1::GenerateRequest(), "empty request");
  v1::GenerateRequest request = TextRequest({kDocs[0]}, "Once upon a time", 10);
  request.set_mode("turbo");
  expect_invalid(request, "mode");
  request = TextRequest({kDocs[0], kDocs[1]}, "Once upon a time", 10);
  request.set_repair_tokens(-3);
  expect_invalid(request, "repair_tokens: -3");
  request = TextRequest({kDocs[0]}, "Once upon a time", 600);
  expect_invalid(request, "max_tokens 600");
  request = TextRequest({kDocs[0]}, "Once upon a time", 10);
  v1::Document* bad_doc = request.add_documents();
  for (int id : {5, 70, 512}) bad_doc->mutable_tokens()->add_ids(id);
  expect_invalid(request, "documents[1][2]: token id 512");
  request = TextRequest({kDocs[0]}, "Once upon a time", 10);
  request.mutable_sampling()->set_top_p(2);
  expect_invalid(request, "sampling.top_p");
  request = TextRequest({kDocs[0], ""}, "x", 10);
  expect_invalid(request, "documents[1] is empty");
  // Texts past --max-text-bytes are refused by size, before tokenizing.
  request = TextRequest({kDocs[0], std::string(4097, 'a')}, "x", 10);
  expect_invalid(request, "documents[1].text: 4097 bytes, at most 4096");
  request = TextRequest({kDocs[0]}, std::string(5000, 'b'), 10);
  expect_invalid(request, "prompt_text: 5000 bytes");
  request = TextRequest({kDocs[0], kDocs[1], kDocs[2]}, "Once upon a time", 200);  // fits the context, not the pool
  expect_invalid(request, "KV blocks");
  // Nothing was lost: a good request still works.
  const Reply good = Call(*stub, TextRequest({kDocs[0]}, "Once upon a time", 10));
  EXPECT_TRUE(good.status.ok()) << good.status.error_message();
  EXPECT_EQ(good.tokens.size(), 10u);
  const std::string page = MetricsWhenIdle(*worker);
  ExpectNoBlocksHeldByRequests(page);
  // Every refusal is counted, whether the service or the engine refused it.
  EXPECT_EQ(Metric(page, "lazykv_worker_requests_total{outcome=\"INVALID_ARGUMENT\"}"), invalid);
}

TEST(WorkerServerTest, CancellationAndDeadlinesFreeBlocksAtOnce) {
  const std::string dir = TempDir("worker_cancel");
  // A slower model, so the requests are still running when they are cut off.
  auto worker = StartWorker(dir, {"--model", "synthetic:small", "--cache-dir", dir + "/cache"});
  auto stub = Stub(worker->address());
  v1::GenerateRequest request;
  request.add_documents()->set_text("a document of a few words for the cancellation test");
  request.set_prompt_text("and a question");
  request.mutable_sampling()->set_max_tokens(2000);
  const Reply cancelled = Call(*stub, request, 60000, [](grpc::ClientContext& context) { context.TryCancel(); });
  EXPECT_EQ(cancelled.status.error_code(), grpc::StatusCode::CANCELLED);
  std::string page = MetricsWhenCounted(*worker, {"CANCELLED"}, 1);
  ExpectNoBlocksHeldByRequests(page);
  EXPECT_EQ(Metric(page, "lazykv_worker_requests_total{outcome=\"CANCELLED\"}"), 1);

  const Reply expired = Call(*stub, request, /*deadline_ms=*/300 * SlowdownFactor());
  EXPECT_EQ(expired.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  page = MetricsWhenCounted(*worker, {"CANCELLED", "DEADLINE_EXCEEDED"}, 2);
  ExpectNoBlocksHeldByRequests(page);
  // The server dates the deadline from when the call reached it, a little after the client
  // sent it; when the client's timer ends the stream more than the server's 100 ms of slack
  // before that (a process slowed down 10x under ThreadSanitizer), it is counted cancelled.
  // Counted once either way.
  EXPECT_EQ(Metric(page, "lazykv_worker_requests_total{outcome=\"DEADLINE_EXCEEDED\"}") +
                Metric(page, "lazykv_worker_requests_total{outcome=\"CANCELLED\"}"),
            2);
  if (SlowdownFactor() == 1) {
    EXPECT_EQ(Metric(page, "lazykv_worker_requests_total{outcome=\"DEADLINE_EXCEEDED\"}"), 1);
  }
  stub.reset();
  EXPECT_EQ(worker->Stop(SIGTERM), 0);
}

TEST(WorkerServerTest, AdmissionQueuesForPoolRoomAndRefusesPastTheBound) {
  std::mt19937_64 rng(FreshSeed());
  v1::GenerateRequest request;
  for (int d = 0; d < 2; ++d) {
    auto* tokens = request.add_documents()->mutable_tokens();
    for (int32_t id : RandomTokens(rng, 20, 4096)) tokens->add_ids(id);
  }
  for (int32_t id : RandomTokens(rng, 4, 4096)) request.mutable_prompt_tokens()->add_ids(id);
  // 95 positions in blocks of 16: a worst case of 6 private blocks (4 prompt + 50 new tokens)
  // and 5 shared (the anchor and the two documents); a second request adds 6 more.
  request.mutable_sampling()->set_max_tokens(50);
  for (const int max_queued : {0, 1}) {
    SCOPED_TRACE(absl::StrCat("max queued ", max_queued));
    const std::string dir = TempDir("worker_admission");
    // synthetic:small (a slower model) with 12 blocks of 96 KiB: one request at a time.
    auto worker = StartWorker(dir, {"--model", "synthetic:small", "--cache-dir", dir + "/cache", "--kv-pool", "1152KiB",
                                    "--max-queued-requests", std::to_string(max_queued)});
    auto stub = Stub(worker->address());
    std::promise<void> first_streaming;
    auto first = std::async(std::launch::async, [&] {
      return Call(*stub, request, 60000, [&](grpc::ClientContext&) { first_streaming.set_value(); });
    });
    // A first call refused before it streams fails here instead of waiting forever.
    ASSERT_EQ(first_streaming.get_future().wait_for(std::chrono::seconds(60)), std::future_status::ready)
        << "the first call never streamed";
    const Reply second = Call(*stub, request);
    const Reply first_reply = first.get();
    ASSERT_TRUE(first_reply.status.ok()) << first_reply.status.error_message();
    if (max_queued == 0) {
      EXPECT_EQ(second.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
      EXPECT_NE(second.status.error_message().find("max_queued_requests=0"), std::string::npos)
          << second.status.error_message();
    } else {
      ASSERT_TRUE(second.status.ok()) << second.status.error_message();
      EXPECT_EQ(second.tokens, first_reply.tokens);
      EXPECT_GT(second.done.timings().queue_ms(), 0);  // it waited for the first to finish
    }
    ExpectNoBlocksHeldByRequests(MetricsWhenIdle(*worker));
  }
}

// kB of a /proc/PID/status field (VmHWM: peak resident memory); -1 when unreadable.
int64_t ProcStatusKb(pid_t pid, const std::string& field) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1));
  }
  return -1;
}

TEST(WorkerServerTest, AnOverloadIsShedAtOnceAndWhatIsAcceptedFinishes) {
  const std::string dir = TempDir("worker_overload");
  // Two run and two wait; forty arrive at once (a 10x overload of what the worker takes).
  auto worker = StartWorker(dir, {"--model", "synthetic:small", "--cache-dir", dir + "/cache", "--max-running-requests",
                                  "2", "--max-queued-requests", "2"});
  auto stub = Stub(worker->address());
  const int64_t rss_before = ProcStatusKb(worker->pid(), "VmRSS");
  std::mt19937_64 rng(FreshSeed());
  v1::GenerateRequest request;
  for (int32_t id : RandomTokens(rng, 40, 4096)) request.add_documents()->mutable_tokens()->add_ids(id);
  for (int32_t id : RandomTokens(rng, 4, 4096)) request.mutable_prompt_tokens()->add_ids(id);
  request.mutable_sampling()->set_max_tokens(60);
  constexpr int kCalls = 40;
  std::vector<std::future<std::pair<Reply, double>>> calls;
  for (int i = 0; i < kCalls; ++i) {
    calls.push_back(std::async(std::launch::async, [&] {
      const auto start = std::chrono::steady_clock::now();
      Reply reply = Call(*stub, request, 120000 * SlowdownFactor());
      return std::make_pair(std::move(reply),
                            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }));
  }
  int ok = 0, shed = 0;
  double slowest_refusal = 0;
  for (auto& call : calls) {
    auto [reply, seconds] = call.get();
    if (reply.status.ok()) {
      ++ok;
      EXPECT_EQ(reply.tokens.size(), 60u);
    } else {
      ++shed;
      EXPECT_EQ(reply.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << reply.status.error_message();
      EXPECT_NE(reply.status.error_message().find("max_running_requests=2"), std::string::npos)
          << reply.status.error_message();
      slowest_refusal = std::max(slowest_refusal, seconds);
    }
  }
  EXPECT_GE(ok, 4);     // what ran and what waited
  EXPECT_GT(shed, 20);  // most of the overload, refused
  EXPECT_EQ(ok + shed, kCalls);
  // Refused at once, not after waiting behind the others.
  EXPECT_LT(slowest_refusal, 2.0 * SlowdownFactor());
  const std::string page = MetricsWhenIdle(*worker);
  EXPECT_EQ(Metric(page, "lazykv_worker_requests_total{outcome=\"RESOURCE_EXHAUSTED\"}"), shed);
  ExpectNoBlocksHeldByRequests(page);
  // Memory held: the overload cost no more than a few MiB beyond the preallocated pool.
  const int64_t peak = ProcStatusKb(worker->pid(), "VmHWM");
  if (rss_before > 0 && peak > 0) {
    EXPECT_LT(peak - rss_before, 64 * 1024) << "peak " << peak << " kB";
  }
  stub.reset();
  EXPECT_EQ(worker->Stop(SIGTERM), 0);
}

TEST(WorkerServerTest, TwoWorkersSharingACacheServerComputeEachDocumentOnce) {
  if (!HaveModel("stories260K.bin") || !HaveModel("tok512.bin")) GTEST_SKIP() << "no stories260K in ../shared/models";
  const std::string dir = TempDir("worker_fleet");
  auto cache = StartCacheServer(dir);
  ASSERT_TRUE(cache->started());
  // A cache call that misses its deadline marks the server down, and the worker then computes
  // the chunk itself: a floor far above the loaded 2-core CI machine's call times (under TSan
  // one call once took past 20 ms x 10: a document computed twice).
  const std::string deadline_floor_ms = std::to_string(100 * SlowdownFactor());
  // A worker that waits for the other's lease gives up after 3x its own estimate of the chunk's
  // compute time, 250 ms at least, and computes it too. The holder's publication can come later
  // than that where it computes several documents in turn on a loaded machine (under TSan with
  // the other tests beside it: a document computed twice), so the floor is raised: the holders
  // here are healthy, and single flight is what is tested.
  const std::string lease_wait_floor_ms = std::to_string(1000 * SlowdownFactor());
  std::vector<std::unique_ptr<ServerProcess>> workers;
  for (int w = 0; w < 2; ++w) {
    workers.push_back(StartWorker(
        dir + "/w" + std::to_string(w),
        {"--model", ModelPath("stories260K.bin"), "--tokenizer", ModelPath("tok512.bin"), "--cache-servers",
         cache->address(), "--cache-min-deadline-ms", deadline_floor_ms, "--lease-wait-min-ms", lease_wait_floor_ms,
         // single flight is the point here, not fetch-or-recompute
         "--fetch-policy", "always"}));
  }
  // 10 random documents (token ids), 12 requests of 3 in random orders, sent to both
  // workers at once, in opposite orders.
  std::mt19937_64 rng(FreshSeed());
  std::vector<std::vector<int32_t>> docs;
  for (int d = 0; d < 10; ++d) docs.push_back(RandomTokens(rng, std::uniform_int_distribution<int>(20, 60)(rng), 512));
  std::vector<v1::GenerateRequest> requests;
  std::set<int> used;
  for (int r = 0; r < 12; ++r) {
    std::vector<int> order(docs.size());
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    v1::GenerateRequest request;
    for (int k = 0; k < 3; ++k) {
      auto* tokens = request.add_documents()->mutable_tokens();
      for (int32_t id : docs[order[k]]) tokens->add_ids(id);
      used.insert(order[k]);
    }
    for (int32_t id : RandomTokens(rng, 6, 512)) request.mutable_prompt_tokens()->add_ids(id);
    request.mutable_sampling()->set_max_tokens(4);
    requests.push_back(std::move(request));
  }
  int distinct_doc_tokens = 0;
  for (int d : used) distinct_doc_tokens += static_cast<int>(docs[d].size());

  std::vector<std::future<std::vector<Reply>>> runs;
  for (int w = 0; w < 2; ++w) {
    runs.push_back(std::async(std::launch::async, [&, w] {
      auto stub = Stub(workers[w]->address());
      std::vector<Reply> replies(requests.size());
      for (size_t k = 0; k < requests.size(); ++k) {
        const size_t r = w == 0 ? k : requests.size() - 1 - k;
        replies[r] = Call(*stub, requests[r]);
      }
      return replies;
    }));
  }
  std::vector<std::vector<Reply>> replies;
  for (auto& run : runs) replies.push_back(run.get());
  int computed = 0, remote = 0;
  for (int w = 0; w < 2; ++w) {
    int doc_tokens = 0, doc_cached = 0;
    for (size_t r = 0; r < requests.size(); ++r) {
      const Reply& reply = replies[w][r];
      ASSERT_TRUE(reply.status.ok()) << reply.status.error_message();
      EXPECT_EQ(reply.tokens, replies[0][r].tokens) << "request " << r;  // same KV, same greedy output
      const v1::Usage& u = reply.done.usage();
      computed += u.document_computed_tokens();
      remote += u.remote_tokens();
      EXPECT_EQ(u.host_tokens() + u.disk_tokens(), 0);  // a cache server, not an embedded tier
      EXPECT_EQ(u.remote_bytes_fetched(), u.kv_bytes_fetched());
      EXPECT_EQ(u.remote_tokens() > 0, u.remote_bytes_fetched() > 0);
      EXPECT_EQ(u.chunk_recomputes(), 0);  // --fetch-policy always
      doc_tokens += reply.done.usage().document_tokens();
      doc_cached += reply.done.usage().document_cached_tokens();
    }
    std::cout << "worker " << w << " hit ratio " << static_cast<double>(doc_cached) / doc_tokens << "\n";
  }
  // Fleet compute 1.0: each distinct document prefilled once across both workers; what one
  // computed, the other fetched from the cache server.
  EXPECT_EQ(computed, distinct_doc_tokens)
      << "lease waits: " << Metric(MetricsWhenIdle(*workers[0]), "lazykv_worker_lease_waits_total") << " and "
      << Metric(MetricsWhenIdle(*workers[1]), "lazykv_worker_lease_waits_total");
  EXPECT_GT(remote, 0);
  // Both workers run beside the cache server: what they fetched came through its shared
  // memory (the transport the worker picks by itself), and each says so in its metrics.
  double shm_bytes = 0, sessions = 0;
  for (auto& worker : workers) {
    const std::string page = MetricsWhenIdle(*worker);
    EXPECT_EQ(Metric(page, "lazykv_worker_tier_fetched_bytes_total{transport=\"grpc\"}"), 0);
    EXPECT_LE(Metric(page, "lazykv_worker_tier_shm_sessions"), 1);
    sessions += Metric(page, "lazykv_worker_tier_shm_sessions");
    shm_bytes += Metric(page, "lazykv_worker_tier_fetched_bytes_total{transport=\"shm\"}");
  }
  EXPECT_GE(sessions, 1);
  EXPECT_GT(shm_bytes, 0);
  for (auto& worker : workers) EXPECT_EQ(worker->Stop(SIGTERM), 0);
}

TEST(WorkerServerTest, SigtermLetsInFlightCallsFinish) {
  const std::string dir = TempDir("worker_sigterm");
  // A grace period that any build finishes 40 tokens in: the call in flight must end well.
  auto worker = StartWorker(dir, {"--model", "synthetic:small", "--cache-dir", dir + "/cache"}, /*grace_ms=*/10000);
  auto stub = Stub(worker->address());
  v1::GenerateRequest request;
  request.set_prompt_text("a question");
  request.mutable_sampling()->set_max_tokens(40);
  std::promise<int> exit_code;
  const Reply reply = Call(*stub, request, 60000, [&](grpc::ClientContext&) {
    std::thread([&] { exit_code.set_value(worker->Stop(SIGTERM)); }).detach();
  });
  EXPECT_TRUE(reply.status.ok()) << reply.status.error_message();
  ASSERT_FALSE(reply.messages.empty());
  EXPECT_TRUE(reply.messages.back().has_done());
  stub.reset();
  EXPECT_EQ(exit_code.get_future().get(), 0);
}

}  // namespace
}  // namespace lazykv::testing
