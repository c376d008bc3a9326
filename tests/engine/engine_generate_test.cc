// Generation end to end: the trained model's known story, sampling, and bad requests.
#include <random>

#include "gtest/gtest.h"
#include "tests/engine/engine_test_util.h"
#include "tests/test_util.h"
#include "worker/model/llama2c_loader.h"
#include "worker/model/synthetic_model.h"
#include "worker/tokenizer/tokenizer.h"

namespace lazykv::testing {
namespace {

TEST(StoriesModelTest, GreedyFromTheAnchorTellsTheKnownStory) {
  if (!HaveModel("stories260K.bin") || !HaveModel("tok512.bin")) GTEST_SKIP() << "no ../shared/models";
  auto weights = LoadLlama2cCheckpoint(ModelPath("stories260K.bin"));
  auto tokenizer = LoadTokenizer(ModelPath("tok512.bin"));
  ASSERT_TRUE(weights.ok() && tokenizer.ok());
  for (AttentionMode mode : {AttentionMode::kLazy, AttentionMode::kNone}) {
    auto engine = MakeEngine(*weights, mode);
    GenerateRequest request;  // no documents, no prompt: the anchor (BOS) alone
    request.sampling.max_tokens = 60;
    auto result = engine->Generate(request);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->prompt_token_ids, std::vector<int32_t>{1});
    const std::string text = DecodeContinuation(**tokenizer, result->prompt_token_ids, result->tokens);
    EXPECT_TRUE(
        text.starts_with("Once upon a time, there was a little girl named Lily. She loved to play outside "
                         "in the park. One day, she saw a big, red ball."))
        << text;

    // The same tokens from the independent naive implementation, greedily, step by step.
    std::vector<int32_t> sequence = {1};
    for (size_t step = 0; step < 25; ++step) {
      const auto logits = NaiveForward(*weights, sequence).back();
      const int32_t next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      ASSERT_EQ(next, result->tokens[step]) << "step " << step;
      sequence.push_back(next);
    }
  }
}

TEST(SamplingTest, SeededSamplingIsReproducibleAndSeedsDiffer) {
  const ModelWeights weights = MakeSyntheticWeights(*SyntheticConfig("tiny"), FreshSeed());
  auto engine = MakeEngine(weights, AttentionMode::kLazy);
  GenerateRequest request;
  request.prompt = {5, 6, 7};
  // No nucleus cut: with random weights one token can hold over 95% of the mass at every
  // step, and then every seed would pick the same tokens (a rare flake seen once).
  request.sampling = SamplingParams{.max_tokens = 24, .temperature = 1.5f, .top_p = 1.0f, .seed = 42};
  auto a = engine->Generate(request);
  auto b = engine->Generate(request);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->tokens, b->tokens);
  EXPECT_EQ(a->logprobs, b->logprobs);
  bool some_seed_differs = false;
  for (uint64_t seed = 43; seed < 48; ++seed) {
    request.sampling.seed = seed;
    auto c = engine->Generate(request);
    ASSERT_TRUE(c.ok());
    some_seed_differs |= c->tokens != a->tokens;
  }
  EXPECT_TRUE(some_seed_differs);
  for (float lp : a->logprobs) EXPECT_LE(lp, 0.0f);
}

// A backend whose logits peak at scripted tokens, one per forward call that asks for
// logits: it drives the engine's decode loop to EOS or max_tokens exactly.
class ScriptedBackend : public Backend {
 public:
  ScriptedBackend(ModelConfig config, std::vector<int32_t> script) : config_(config), script_(std::move(script)) {}
  const ModelConfig& config() const override { return config_; }
  std::string kv_dtype() const override { return "fp32"; }
  int block_size() const override { return 16; }
  int num_blocks() const override { return 64; }
  uint64_t kv_bytes_per_block() const override { return 0; }
  Hash128 model_fingerprint() const override { return Hash128{7, 7}; }
  absl::Status Forward(std::span<const SequenceStep> steps, std::vector<std::vector<float>>* logits) override {
    logits->assign(steps.size(), {});
    for (size_t i = 0; i < steps.size(); ++i) {
      if (steps[i].logits == LogitsWanted::kNone) continue;
      (*logits)[i].assign(config_.vocab_size, 0.0f);
      (*logits)[i][script_.at(calls_++)] = 10.0f;
    }
    return absl::OkStatus();
  }
  absl::Status CopyBlocksRotated(std::span<const BlockCopy>) override { return absl::OkStatus(); }
  absl::StatusOr<std::unique_ptr<ExportedChunk>> CaptureChunk(std::span<const KvBlockRef>) override {
    return absl::UnimplementedError("scripted backend holds no KV");
  }
  absl::StatusOr<std::unique_ptr<StagedChunk>> StageChunk(const ChunkBytes&, const StageOptions&) override {
    return absl::UnimplementedError("scripted backend holds no KV");
  }
  absl::Status ImportStaged(std::unique_ptr<StagedChunk>, std::span<const KvBlockRef>) override {
    return absl::UnimplementedError("scripted backend holds no KV");
  }

 private:
  ModelConfig config_;
  std::vector<int32_t> script_;
  size_t calls_ = 0;
};

TEST(SamplingTest, UnseededRequestsGetFreshSeedsThatReplay) {
  // Without a seed, two sampled requests must not repeat each other (a default seed of 0
  // made every unseeded request draw the same tokens); the seed drawn is reported, and
  // sending it back replays the request exactly.
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  auto config = SyntheticConfig("tiny");
  ASSERT_TRUE(config.ok());
  const ModelWeights weights = MakeSyntheticWeights(*config, seed);
  auto engine = MakeEngine(weights, AttentionMode::kLazy);
  std::mt19937_64 rng(seed);
  GenerateRequest request;
  request.prompt = RandomTokens(rng, 5, weights.config.vocab_size);
  request.sampling = SamplingParams{.max_tokens = 16, .temperature = 2.0f, .top_p = 1.0f, .seed = std::nullopt};
  auto a = engine->Generate(request);
  auto b = engine->Generate(request);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
  EXPECT_NE(a->seed, b->seed);
  EXPECT_NE(a->tokens, b->tokens) << "two unseeded sampled requests drew the same 16 tokens";
  request.sampling.seed = a->seed;
  auto replay = engine->Generate(request);
  ASSERT_TRUE(replay.ok()) << replay.status();
  EXPECT_EQ(replay->seed, a->seed);
  EXPECT_EQ(replay->tokens, a->tokens);
  EXPECT_EQ(replay->logprobs, a->logprobs);
}

TEST(TimingTest, QueueTtftAndTotalCountFromTheArrivalStamp) {
  // A server stamps the call's arrival before tokenizing and handing it to the engine
  // thread: the engine's timings count from there, not from Submit.
  auto config = SyntheticConfig("tiny");
  ASSERT_TRUE(config.ok());
  const ModelWeights weights = MakeSyntheticWeights(*config, 3);
  auto engine = MakeEngine(weights, AttentionMode::kLazy);
  GenerateRequest request;
  request.prompt = {5, 6, 7};
  request.sampling.max_tokens = 2;
  auto unstamped = engine->Generate(request);
  ASSERT_TRUE(unstamped.ok());
  request.arrival = std::chrono::steady_clock::now() - std::chrono::milliseconds(300);
  auto stamped = engine->Generate(request);
  ASSERT_TRUE(stamped.ok());
  EXPECT_LT(unstamped->queue_seconds, 0.25);
  EXPECT_GE(stamped->queue_seconds, 0.3);
  EXPECT_GE(stamped->ttft_seconds, stamped->queue_seconds);
  EXPECT_GE(stamped->total_seconds, stamped->ttft_seconds);
  EXPECT_LT(stamped->total_seconds, 0.3 + 30.0);
}

TEST(SamplingTest, StopsAtEosOrMaxTokensAndReportsWhich) {
  const ModelConfig config = *SyntheticConfig("tiny");
  const int32_t eos = config.eos_id;
  struct Case {
    std::vector<int32_t> script;
    int max_tokens;
    std::vector<int32_t> tokens;
    std::string finish;
  };
  for (const Case& c : {Case{{5, 9, eos, 7}, 10, {5, 9}, "stop"}, Case{{5, 9, 11, 7}, 3, {5, 9, 11}, "length"},
                        Case{{eos}, 3, {}, "stop"}, Case{{5}, 0, {}, "length"}}) {
    auto engine = Engine::Create(std::make_unique<ScriptedBackend>(config, c.script), EngineOptions{});
    ASSERT_TRUE(engine.ok());
    GenerateRequest request;
    request.prompt = {7, 8};
    request.sampling.max_tokens = c.max_tokens;
    auto r = (*engine)->Generate(request);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->tokens, c.tokens);
    EXPECT_EQ(r->finish_reason, c.finish);
    EXPECT_EQ(r->logprobs.size(), c.tokens.size());
  }
}

// A request's stop_token_ids and the model's other end-of-sequence ids end the reply as
// eos_id does; an id that merely resembles one (the next id) does not.
TEST(SamplingTest, StopTokenIdsAndOtherEosIdsEndTheReply) {
  ModelConfig config = *SyntheticConfig("tiny");
  config.other_eos_ids = {40};
  struct Case {
    std::vector<int32_t> script;
    std::vector<int32_t> stop_token_ids;
    std::vector<int32_t> tokens;
    std::string finish;
  };
  for (const Case& c : {Case{{5, 40, 7}, {}, {5}, "stop"}, Case{{5, 41, 33, 7}, {33}, {5, 41}, "stop"},
                        Case{{5, 34, 41, 7}, {33}, {5, 34, 41, 7}, "length"}}) {
    auto engine = Engine::Create(std::make_unique<ScriptedBackend>(config, c.script), EngineOptions{});
    ASSERT_TRUE(engine.ok());
    GenerateRequest request;
    request.prompt = {7, 8};
    request.sampling.max_tokens = 4;
    request.sampling.stop_token_ids = c.stop_token_ids;
    auto r = (*engine)->Generate(request);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->tokens, c.tokens);
    EXPECT_EQ(r->finish_reason, c.finish);
  }
}

TEST(BadRequestTest, ClearErrorsAndNothingLost) {
  const ModelWeights weights = MakeSyntheticWeights(*SyntheticConfig("tiny"), FreshSeed());
  auto engine = MakeEngine(weights, AttentionMode::kLazy);
  GenerateRequest good;
  good.docs = {{10, 11, 12, 13}, {20, 21, 22}};
  good.prompt = {30, 31};
  good.sampling.max_tokens = 4;
  auto before = engine->Generate(good);
  ASSERT_TRUE(before.ok());
  const size_t cached_entries = engine->stats().cached_entries;

  auto expect_invalid = [&](GenerateRequest request, const std::string& needle) {
    auto r = engine->Generate(request);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status();
  };
  GenerateRequest bad = good;
  bad.docs[1][2] = 512;
  expect_invalid(bad, "documents[1][2]");
  bad = good;
  bad.prompt[0] = -1;
  expect_invalid(bad, "prompt[0]");
  bad = good;
  bad.sampling.stop_token_ids = {3, 512};
  expect_invalid(bad, "stop_token_ids[1]");
  bad = good;
  bad.sampling.max_tokens = weights.config.max_seq_len;
  expect_invalid(bad, "context");
  bad = good;
  bad.sampling.temperature = -1;
  expect_invalid(bad, "temperature");
  bad = good;
  bad.sampling.top_p = 0;
  expect_invalid(bad, "top_p");

  // Nothing stored was lost and the engine still serves the same answer from cache.
  EXPECT_EQ(engine->stats().cached_entries, cached_entries);
  auto after = engine->Generate(good);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->tokens, before->tokens);
  EXPECT_EQ(after->usage.chunk_hits, 3);
  ExpectNoLeakedBlocks(*engine);
}

TEST(EmptyPromptTest, LastDocumentBecomesTheRequestsOwnTokens) {
  const ModelWeights weights = MakeSyntheticWeights(*SyntheticConfig("tiny-hf"), FreshSeed());
  auto lazy = MakeEngine(weights, AttentionMode::kLazy);
  auto block = MakeEngine(weights, AttentionMode::kBlock);
  GenerateRequest request;
  request.docs = {{10, 11, 12, 13, 14}, {20, 21, 22}};
  request.sampling.max_tokens = 5;
  request.record_logits = true;
  auto a = lazy->Generate(request);
  auto b = block->Generate(request);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->tokens, b->tokens);
  EXPECT_EQ(a->usage.chunk_misses, 2);  // the anchor and the first document; the last is computed in place
  EXPECT_EQ(a->usage.computed_tokens, a->usage.prompt_tokens);
  EXPECT_LT(RelativeError(a->step_logits[0], b->step_logits[0]), 1e-4);
}

}  // namespace
}  // namespace lazykv::testing
