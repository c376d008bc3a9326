// A document's KV blocks lie in one run of consecutive pool blocks (the prefill kernels read a
// KV tile of consecutive blocks as one TMA copy; a tile that straddles two runs falls back to
// cp.async), after churn that frees requests' blocks in every order. The reference is the block
// tables as the backend receives them, recorded by a wrapper: each document's entries (a run of
// one nonzero delta, in lazy mode) must name blocks b, b + 1, b + 2, ...
#include <map>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/engine/engine_compare_util.h"
#include "tests/engine/engine_test_util.h"
#include "tests/engine/forwarding_backend.h"
#include "tests/test_util.h"
#include "worker/backend/cpu_backend.h"

namespace lazykv::testing {
namespace {

// The CPU backend, recording each document's blocks (delta -> block ids) of every step's table.
class TableRecorder : public ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  absl::Status Forward(std::span<const SequenceStep> steps, std::vector<std::vector<float>>* logits) override {
    for (const SequenceStep& step : steps) {
      std::map<int32_t, std::vector<int32_t>> documents;  // a table's entries of one nonzero delta
      for (const KvBlockRef& ref : step.context) {
        if (ref.delta != 0) documents[ref.delta].push_back(ref.block);
      }
      for (auto& [delta, blocks] : documents) tables.push_back(std::move(blocks));
      if (step.tokens.size() > 1) {  // a prefill piece: its sequence's whole table
        std::vector<int32_t>& all = prefill_tables.emplace_back();
        for (const KvBlockRef& ref : step.context) all.push_back(ref.block);
      }
    }
    return ForwardingBackend::Forward(steps, logits);
  }

  std::vector<std::vector<int32_t>> tables;          // every document's blocks, in each step it was read
  std::vector<std::vector<int32_t>> prefill_tables;  // the table of every prefill piece of 2+ tokens
};

// Every list of blocks in `runs` is b, b + 1, b + 2, ... (what: whose blocks they are).
void ExpectEachOneRun(const std::vector<std::vector<int32_t>>& runs, const char* what) {
  ASSERT_FALSE(runs.empty());
  for (const std::vector<int32_t>& blocks : runs) {
    for (size_t i = 1; i < blocks.size(); ++i) {
      ASSERT_EQ(blocks[i], blocks[0] + static_cast<int32_t>(i))
          << what << ": block " << i << " of " << blocks.size() << " is not the run's next";
    }
  }
}

// 40 requests of 2-4 random documents (of a corpus of 12, 5 to 70 tokens) and a prompt, on a
// pool of 1024 blocks of 8 slots; `max_prefill_tokens` tokens of prefill a step. Lazy mode: every
// document's blocks must be one run. None mode (the whole prompt is the request's own tokens,
// cut into pieces like a long question): every prefill piece's table must be one run.
void RunChurn(int max_prefill_tokens, AttentionMode mode = AttentionMode::kLazy) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  const ModelWeights weights = RandomModel("tiny", seed);
  auto cpu = CreateCpuBackend(weights, 8, 1024);  // blocks of 8 slots
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  auto recorder = std::make_unique<TableRecorder>(*std::move(cpu));
  const TableRecorder* seen = recorder.get();
  EngineOptions options;
  options.mode = mode;
  options.max_running_requests = 4;
  options.max_queued_requests = 64;
  options.max_prefill_tokens = max_prefill_tokens;
  auto engine = Engine::Create(std::move(recorder), options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::vector<std::vector<int32_t>> corpus = RandomDocuments(rng, weights.config.vocab_size, 12);
  constexpr int kRequests = 40;
  for (int r = 0; r < kRequests; ++r) {
    GenerateRequest request;
    for (int k = 0, n = 2 + rng() % 3; k < n; ++k) request.docs.push_back(corpus[rng() % corpus.size()]);
    request.prompt = RandomTokens(rng, 1 + rng() % 20, weights.config.vocab_size);
    request.sampling.max_tokens = 1 + rng() % 20;
    ASSERT_TRUE((*engine)->Submit(request).ok());
  }
  StepUntilIdle(**engine, kRequests);
  if (mode == AttentionMode::kNone) {
    ExpectEachOneRun(seen->prefill_tables, "a prompt's prefill table");
  } else {
    ExpectEachOneRun(seen->tables, "a document");
  }
  ExpectNoLeakedBlocks(**engine);
}

TEST(EngineBlockRunsTest, DocumentsStayOneRunAfterChurn) {
  // Requests that finish in random order free their own blocks in every order. A pool handed out
  // a block at a time (most recently freed first, or lowest first) splits later documents over
  // its holes.
  RunChurn(512);
}

TEST(EngineBlockRunsTest, PromptsPrefilledOverSeveralStepsStayOneRun) {
  // The request's own tokens cut into pieces: a question's blocks (here the whole prompt's, in
  // none mode) are taken for its remainder at its first piece, as a document's are.
  RunChurn(12, AttentionMode::kNone);
}

TEST(EngineBlockRunsTest, DocumentsEncodedOverSeveralStepsStayOneRun) {
  // 12 prefill tokens a step: a document of up to 70 tokens is encoded over up to 6 steps, while
  // other sequences take blocks in the steps between. A piece's blocks taken only when it runs
  // land after another sequence's.
  RunChurn(12);
}

}  // namespace
}  // namespace lazykv::testing
