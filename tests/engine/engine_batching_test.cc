// Continuous batching: many requests in flight at once, with chunked prefill, give each
// request exactly what it gets alone; a document several requests miss together is
// encoded once; cancellation frees blocks at once; admission waits for pool room and
// refuses past the queue bound.
#include <map>
#include <random>
#include <set>

#include "gtest/gtest.h"
#include "tests/engine/engine_test_util.h"
#include "tests/test_util.h"
#include "worker/model/synthetic_model.h"

namespace lazykv::testing {
namespace {

struct Workload {
  ModelWeights weights;
  std::vector<std::vector<int32_t>> docs;
  std::vector<GenerateRequest> requests;
};

Workload MakeWorkload(uint64_t seed, int num_requests) {
  std::mt19937_64 rng(seed);
  Workload w{MakeSyntheticWeights(*SyntheticConfig("tiny"), seed), {}, {}};
  for (int d = 0; d < 6; ++d) w.docs.push_back(RandomTokens(rng, std::uniform_int_distribution<int>(9, 40)(rng), 512));
  for (int i = 0; i < num_requests; ++i) {
    GenerateRequest r;
    std::vector<int> order = {0, 1, 2, 3, 4, 5};
    std::shuffle(order.begin(), order.end(), rng);
    for (int k = 0; k < 3; ++k) r.docs.push_back(w.docs[order[k]]);
    r.prompt = RandomTokens(rng, std::uniform_int_distribution<int>(1, 12)(rng), 512);
    r.sampling.max_tokens = std::uniform_int_distribution<int>(1, 10)(rng);
    r.record_logits = true;
    w.requests.push_back(std::move(r));
  }
  return w;
}

// Steps `engine` until every id has finished or failed; events by request, in order.
std::map<RequestId, std::vector<EngineEvent>> RunToCompletion(Engine& engine, int* max_running = nullptr) {
  std::map<RequestId, std::vector<EngineEvent>> by_request;
  std::vector<EngineEvent> events;
  for (int guard = 0; engine.HasWork(); ++guard) {
    EXPECT_LT(guard, 100000) << "the engine stopped making progress";
    if (guard >= 100000) break;
    events.clear();
    if (max_running) *max_running = std::max(*max_running, engine.stats().running_requests);
    if (engine.Step(&events) == 0) engine.WaitForTier(std::chrono::milliseconds(10));
    for (EngineEvent& e : events) by_request[e.id].push_back(std::move(e));
  }
  return by_request;
}

class BatchingTest : public ::testing::TestWithParam<AttentionMode> {};

TEST_P(BatchingTest, ConcurrentRequestsGetWhatEachGetsAlone) {
  const AttentionMode mode = GetParam();
  const Workload w = MakeWorkload(FreshSeed(), 10);
  // Small prefill pieces force chunked prefill and mixed prefill/decode batches.
  auto engine = MakeEngine(w.weights, mode, /*block_size=*/8, /*num_blocks=*/2048, /*max_prefill_tokens=*/13);
  std::vector<RequestId> ids;
  for (const GenerateRequest& r : w.requests) {
    auto id = engine->Submit(r);
    ASSERT_TRUE(id.ok()) << id.status();
    ids.push_back(*id);
  }
  int max_running = 0;
  auto by_request = RunToCompletion(*engine, &max_running);
  EXPECT_GT(max_running, 1);

  std::set<std::vector<int32_t>> distinct_shared_docs;
  int chunk_misses = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "request " << i);
    const auto& events = by_request[ids[i]];
    ASSERT_FALSE(events.empty());
    ASSERT_EQ(events.back().kind, EngineEvent::Kind::kFinished);
    const GenerateResult& got = *events.back().result;
    // Streamed tokens, in order, are the result's tokens.
    std::vector<int32_t> streamed;
    for (size_t e = 0; e + 1 < events.size(); ++e) {
      ASSERT_EQ(events[e].kind, EngineEvent::Kind::kToken);
      streamed.push_back(events[e].token.id);
    }
    EXPECT_EQ(streamed, got.tokens);
    // The same request alone on a fresh engine (no batching, no reuse).
    auto alone_engine = MakeEngine(w.weights, mode, 8, 2048, 512);
    auto alone = alone_engine->Generate(w.requests[i]);
    ASSERT_TRUE(alone.ok()) << alone.status();
    EXPECT_EQ(got.tokens, alone->tokens);
    ASSERT_EQ(got.step_logits.size(), alone->step_logits.size());
    for (size_t s = 0; s < got.step_logits.size(); ++s) {
      EXPECT_LT(RelativeError(got.step_logits[s], alone->step_logits[s]), 1e-5) << "step " << s;
    }
    const Usage& u = got.usage;
    EXPECT_EQ(u.pool_tokens + u.host_tokens + u.disk_tokens + u.remote_tokens, u.cached_tokens);
    EXPECT_EQ(u.cached_tokens + u.computed_tokens, u.prompt_tokens);
    EXPECT_EQ(u.document_cached_tokens + u.document_computed_tokens, u.document_tokens);
    chunk_misses += u.chunk_misses;
    for (size_t d = 0; d + 1 <= w.requests[i].docs.size(); ++d) distinct_shared_docs.insert(w.requests[i].docs[d]);
  }
  if (mode == AttentionMode::kLazy || mode == AttentionMode::kBlock) {
    // Each document (and the anchor) encoded once, even when requests missed it together.
    EXPECT_EQ(chunk_misses, static_cast<int>(distinct_shared_docs.size()) + 1);
  }
  ExpectNoLeakedBlocks(*engine);
  EXPECT_EQ(engine->stats().reserved_blocks, 0);
}

INSTANTIATE_TEST_SUITE_P(Modes, BatchingTest,
                         ::testing::Values(AttentionMode::kLazy, AttentionMode::kBlock, AttentionMode::kPrefix,
                                           AttentionMode::kNone),
                         [](const auto& info) { return std::string(AttentionModeName(info.param)); });

TEST(BatchingTest, CancellationFreesBlocksAtOnceAndSparesTheOthers) {
  const Workload w = MakeWorkload(FreshSeed(), 2);
  auto engine = MakeEngine(w.weights, AttentionMode::kLazy, 8, 2048, /*max_prefill_tokens=*/5);
  // A and B share every document; A is first, so it owns their encodings.
  GenerateRequest a = w.requests[0];
  GenerateRequest b = w.requests[0];
  b.prompt.push_back(7);
  a.sampling.max_tokens = b.sampling.max_tokens = 30;
  const RequestId id_a = *engine->Submit(a);
  const RequestId id_b = *engine->Submit(b);
  std::vector<EngineEvent> events;
  engine->Step(&events);  // the anchor, encoded for A
  engine->Step(&events);  // A's first document, partly encoded (5-token pieces)
  ASSERT_TRUE(events.empty());
  const int free_before_cancel = engine->stats().free_blocks;
  engine->Cancel(id_a, absl::CancelledError("client went away"));
  EXPECT_EQ(engine->stats().running_requests, 1);
  EXPECT_GE(engine->stats().free_blocks, free_before_cancel);
  auto by_request = RunToCompletion(*engine);
  ASSERT_EQ(by_request[id_a].size(), 1u);
  EXPECT_EQ(by_request[id_a][0].kind, EngineEvent::Kind::kFailed);
  EXPECT_TRUE(absl::IsCancelled(by_request[id_a][0].status));
  ASSERT_EQ(by_request[id_b].back().kind, EngineEvent::Kind::kFinished);
  const GenerateResult& got_b = *by_request[id_b].back().result;
  auto alone = MakeEngine(w.weights, AttentionMode::kLazy)->Generate(b);
  ASSERT_TRUE(alone.ok());
  EXPECT_EQ(got_b.tokens, alone->tokens);
  // B took over the document encodings A had started or queued, and is charged with
  // them; the anchor was done for A before it went, and B reused it.
  EXPECT_EQ(got_b.usage.chunk_misses, alone->usage.chunk_misses - 1);
  EXPECT_EQ(got_b.usage.pool_tokens, 1);
  ExpectNoLeakedBlocks(*engine);

  // A decoding request cancelled mid-stream gives back every block it held.
  const RequestId id_c = *engine->Submit(b);
  for (int i = 0; i < 200 && engine->stats().running_requests == 1; ++i) {
    events.clear();
    engine->Step(&events);
    if (!events.empty()) break;  // its first token
  }
  ASSERT_EQ(engine->stats().running_requests, 1);
  ASSERT_LT(static_cast<size_t>(engine->stats().free_blocks) + engine->stats().cached_blocks,
            static_cast<size_t>(engine->stats().num_blocks));  // its own blocks are out
  engine->Cancel(id_c, absl::DeadlineExceededError("deadline"));
  ExpectNoLeakedBlocks(*engine);
  EXPECT_EQ(engine->stats().reserved_blocks, 0);
  events.clear();
  engine->Step(&events);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].id, id_c);
  EXPECT_TRUE(absl::IsDeadlineExceeded(events[0].status));
}

TEST(BatchingTest, AdmissionWaitsForRoomAndRefusesPastTheQueueBound) {
  const Workload w = MakeWorkload(FreshSeed(), 3);
  auto backend = CreateCpuBackend(w.weights, /*block_size=*/8, /*num_blocks=*/40);
  ASSERT_TRUE(backend.ok());
  EngineOptions options;
  options.max_queued_requests = 1;
  auto engine = *Engine::Create(*std::move(backend), options);
  // Each request's private worst case (its own tokens; the shared documents are reserved
  // once for both) is over half the pool, so one runs at a time.
  GenerateRequest big;
  big.docs = {w.docs[0], w.docs[1]};
  std::mt19937_64 rng(FreshSeed());
  big.prompt = RandomTokens(rng, 8, 512);
  // 8 + 150 own positions: 20 blocks + 2, over half of the 40.
  big.sampling.max_tokens = 150;
  const RequestId first = *engine->Submit(big);
  ASSERT_GT(engine->stats().reserved_blocks * 2, engine->stats().num_blocks) << "the test needs a bigger request";
  ASSERT_LE(engine->ReservedBlocks(big), engine->stats().num_blocks) << "the test needs a smaller request";
  const RequestId second = *engine->Submit(big);
  auto third = engine->Submit(big);
  ASSERT_FALSE(third.ok());
  EXPECT_TRUE(absl::IsResourceExhausted(third.status())) << third.status();
  EXPECT_NE(third.status().message().find("max_queued_requests=1"), std::string::npos) << third.status();
  EXPECT_NE(third.status().message().find("retry"), std::string::npos) << third.status();
  EXPECT_EQ(engine->stats().running_requests, 1);
  EXPECT_EQ(engine->stats().queued_requests, 1);

  // The second starts only once the first has finished.
  std::vector<RequestId> order;
  std::vector<EngineEvent> events;
  while (engine->HasWork()) {
    events.clear();
    engine->Step(&events);
    for (const EngineEvent& e : events) {
      ASSERT_NE(e.kind, EngineEvent::Kind::kFailed) << e.status;
      if (order.empty() || order.back() != e.id) order.push_back(e.id);
    }
  }
  EXPECT_EQ(order, (std::vector<RequestId>{first, second}));
  ExpectNoLeakedBlocks(*engine);

  // A request larger than the pool can ever hold is refused outright.
  GenerateRequest huge = big;
  huge.sampling.max_tokens = 330;
  auto refused = engine->Submit(huge);
  EXPECT_TRUE(absl::IsInvalidArgument(refused.status())) << refused.status();
  EXPECT_NE(refused.status().message().find("KV blocks"), std::string::npos) << refused.status();
}

TEST(BatchingTest, AnOverloadQueuesPastMaxRunningThenIsRefusedAndTheQueueDrainsInOrder) {
  const Workload w = MakeWorkload(FreshSeed(), 3);
  auto backend = CreateCpuBackend(w.weights, /*block_size=*/8, /*num_blocks=*/400);
  ASSERT_TRUE(backend.ok());
  EngineOptions options;
  options.max_running_requests = 3;
  options.max_queued_requests = 4;
  auto engine = *Engine::Create(*std::move(backend), options);
  std::mt19937_64 rng(FreshSeed());
  // Ten small requests arrive at once; the pool could run them all.
  std::vector<RequestId> accepted;
  int refused = 0;
  for (int i = 0; i < 10; ++i) {
    GenerateRequest r;
    r.docs = {w.docs[i % 3]};
    r.prompt = RandomTokens(rng, 4, 512);
    r.sampling.max_tokens = 5;
    auto id = engine->Submit(r);
    if (id.ok()) {
      accepted.push_back(*id);
    } else {
      ++refused;
      EXPECT_TRUE(absl::IsResourceExhausted(id.status())) << id.status();
      EXPECT_NE(id.status().message().find("max_running_requests=3"), std::string::npos) << id.status();
    }
  }
  EXPECT_EQ(accepted.size(), 7u);  // three running, four waiting
  EXPECT_EQ(refused, 3);
  EXPECT_EQ(engine->stats().running_requests, 3);
  EXPECT_EQ(engine->stats().queued_requests, 4);
  std::vector<EngineEvent> events;
  int finished = 0;
  while (engine->HasWork()) {
    events.clear();
    engine->Step(&events);
    EXPECT_LE(engine->stats().running_requests, 3);
    for (const EngineEvent& e : events) {
      ASSERT_NE(e.kind, EngineEvent::Kind::kFailed) << e.status;
      if (e.kind == EngineEvent::Kind::kFinished) ++finished;
    }
  }
  EXPECT_EQ(finished, 7);
  ExpectNoLeakedBlocks(*engine);
}

// Lazy reserves a shared document once for every running request that uses it; block
// reserves its private re-rotated copies on top. A pool too small for two requests that
// share nothing runs two lazy requests sharing their documents at once, and block's one at a
// time; both give every request its tokens.
TEST(BatchingTest, SharedDocumentsAreReservedOnceForTheRequestsUsingThem) {
  const Workload w = MakeWorkload(FreshSeed(), 3);
  std::mt19937_64 rng(FreshSeed());
  GenerateRequest request;
  request.docs = {w.docs[0], w.docs[1], w.docs[2]};
  request.prompt = RandomTokens(rng, 4, 512);
  request.sampling.max_tokens = 6;
  // Reservations on a roomy probe engine: one request alone, and a second one beside it.
  auto reservations = [&](AttentionMode mode) {
    auto probe = *Engine::Create(*CreateCpuBackend(w.weights, /*block_size=*/8, /*num_blocks=*/4096), {});
    request.mode = mode;
    EXPECT_TRUE(probe->Submit(request).ok());
    const int first = probe->stats().reserved_blocks;
    EXPECT_TRUE(probe->Submit(request).ok());
    return std::pair{first, probe->stats().reserved_blocks - first};
  };
  const auto [lazy_first, lazy_second] = reservations(AttentionMode::kLazy);
  const auto [block_first, block_second] = reservations(AttentionMode::kBlock);
  ASSERT_LT(lazy_second, lazy_first) << "the second lazy request shares the documents";
  ASSERT_GT(block_second, lazy_second) << "block reserves its private copies";
  // Room for two lazy requests and one block request, not two block requests.
  const int num_blocks = std::max(lazy_first + lazy_second, block_first);
  ASSERT_GT(block_first + block_second, num_blocks);
  for (AttentionMode mode : {AttentionMode::kLazy, AttentionMode::kBlock}) {
    SCOPED_TRACE(AttentionModeName(mode));
    request.mode = mode;
    auto engine = *Engine::Create(*CreateCpuBackend(w.weights, /*block_size=*/8, num_blocks), {});
    const RequestId a = *engine->Submit(request);
    const RequestId b = *engine->Submit(request);
    EXPECT_EQ(engine->stats().running_requests, mode == AttentionMode::kLazy ? 2 : 1);
    EXPECT_LE(engine->stats().reserved_blocks, num_blocks);
    std::vector<EngineEvent> events;
    int finished = 0;
    while (engine->HasWork()) {
      events.clear();
      engine->Step(&events);
      for (const EngineEvent& e : events) {
        ASSERT_NE(e.kind, EngineEvent::Kind::kFailed) << e.status;
        if (e.kind == EngineEvent::Kind::kFinished) {
          ++finished;
          EXPECT_TRUE(e.id == a || e.id == b);
          // Every token, unless the random model chose end-of-sequence first (some seeds).
          if (e.result->finish_reason == "stop") {
            EXPECT_LT(static_cast<int>(e.result->tokens.size()), request.sampling.max_tokens);
          } else {
            EXPECT_EQ(e.result->finish_reason, "length");
            EXPECT_EQ(static_cast<int>(e.result->tokens.size()), request.sampling.max_tokens);
          }
        }
      }
    }
    EXPECT_EQ(finished, 2);
    EXPECT_EQ(engine->stats().reserved_blocks, 0);
    ExpectNoLeakedBlocks(*engine);
  }
}

}  // namespace
}  // namespace lazykv::testing
