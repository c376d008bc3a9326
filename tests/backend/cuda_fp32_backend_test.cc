// The CUDA backend in fp32 (CudaPrecision::kFp32) against the fp32 CPU backend: the same
// function up to fp32 arithmetic order (and the GPU's fast-math exp, rsqrt and sin), so
// greedy decoding must follow the CPU's token for token, where bf16 rounding parts the two
// at near-ties (cuda_backend_test.cc).
//  - stories260K, RAG requests in lazy mode: 120 greedy tokens equal to the CPU's on every
//    fixed prompt, and on fresh random requests equal unless they part at an fp32-level tie;
//  - lazy and block on the GPU: the same greedy tokens;
//  - random synthetic models: logits within fp32 noise in every mode;
//  - chunk KV: the same fingerprint and payload layout as the fp32 CPU's, so chunks move
//    between the two.
// Skips without a GPU (and the stories tests without ../shared/models).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>

#include "gtest/gtest.h"
#include "tests/engine/engine_compare_util.h"
#include "tests/engine/engine_test_util.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/test_util.h"
#include "worker/backend/cpu_backend.h"
#include "worker/backend/cuda_backend.h"
#include "worker/model/llama2c_loader.h"
#include "worker/model/synthetic_model.h"
#include "worker/tokenizer/tokenizer.h"

namespace lazykv::testing {
namespace {

constexpr CudaBackendOptions kFp32{.precision = CudaPrecision::kFp32};

// fp32 noise on these models: logits differ by ~1e-6 of the largest (two CPU runs that
// differ only in summation order: 6e-7). A parting below kFp32Tie is a tie no reference
// could pin; a wrong rotation, mask or rounding is orders of magnitude above kFp32Logits.
constexpr double kFp32Tie = 1e-5;
constexpr double kFp32Logits = 1e-4;

// stories260K with its tokenizer, the story documents encoded, and a fresh seed.
class CudaFp32StoriesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveGpu()) GTEST_SKIP() << "no GPU";
    if (!HaveModel("stories260K.bin") || !HaveModel("tok512.bin")) GTEST_SKIP() << "no ../shared/models";
    auto weights = LoadLlama2cCheckpoint(ModelPath("stories260K.bin"));
    auto tokenizer = LoadTokenizer(ModelPath("tok512.bin"));
    ASSERT_TRUE(weights.ok() && tokenizer.ok()) << weights.status() << tokenizer.status();
    weights_ = *std::move(weights);
    tokenizer_ = *std::move(tokenizer);
    for (const auto& text : StoryTexts()) corpus_.push_back(tokenizer_->Encode(text));
    const uint64_t seed = FreshSeed();
    std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
    rng_.seed(seed);
  }

  ModelWeights weights_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::vector<std::vector<int32_t>> corpus_;
  std::mt19937_64 rng_;
};

TEST_F(CudaFp32StoriesTest, GreedyEqualsCpu) {
  auto gpu = EngineOn(CreateCudaBackend(weights_, 16, 1024, kFp32), AttentionMode::kLazy);
  auto cpu = MakeEngine(weights_, AttentionMode::kLazy, 16, 1024);
  ASSERT_TRUE(gpu);
  // The bf16 test's four requests (three documents each, then the prompt), then four fresh
  // ones: random documents in a random order before a random prompt.
  const std::vector<std::string> prompts = {"Once upon a time", "One day", "The little bird", "Max and Lily"};
  size_t equal = 0, total = 0;
  double worst_error = 0;
  for (size_t r = 0; r < 2 * prompts.size(); ++r) {
    const bool fixed = r < prompts.size();
    GenerateRequest request;
    if (fixed) {
      for (size_t d = 0; d < 3; ++d) request.docs.push_back(corpus_[(r + d) % corpus_.size()]);
      request.prompt = tokenizer_->Encode(prompts[r]);
    } else {
      std::vector<std::vector<int32_t>> docs = corpus_;
      std::shuffle(docs.begin(), docs.end(), rng_);
      docs.resize(std::uniform_int_distribution<size_t>(1, docs.size())(rng_));
      request.docs = docs;
      request.prompt = RandomTokens(rng_, std::uniform_int_distribution<int>(1, 8)(rng_), 512);
    }
    request.sampling.max_tokens = 120;
    request.record_logits = true;
    auto g = gpu->Generate(request);
    auto c = cpu->Generate(request);
    ASSERT_TRUE(g.ok() && c.ok()) << g.status() << c.status();
    double margin = 0;
    const size_t common = CheckParting(*g, *c, "request " + std::to_string(r), kFp32Tie, &margin);
    const double error = WorstLogitError(*g, *c);
    std::printf(
        "request %zu (%s): %zu of %zu greedy tokens equal to the fp32 CPU's (worst relative logit "
        "difference %.1e%s)\n",
        r, fixed ? prompts[r].c_str() : "random", common, c->tokens.size(), error,
        common < c->tokens.size() ? ", parted at an fp32 tie" : "");
    if (fixed) {
      EXPECT_GE(c->tokens.size(), 100u) << "request " << r;
      EXPECT_EQ(common, c->tokens.size()) << "request " << r << " (" << prompts[r] << ")";
    }
    EXPECT_LT(error, kFp32Logits) << "request " << r;
    equal += common;
    total += c->tokens.size();
    worst_error = std::max(worst_error, error);
  }
  std::printf(
      "stories260K greedy in fp32: %zu of %zu tokens equal to the fp32 CPU's, worst relative logit "
      "difference %.1e\n",
      equal, total, worst_error);
  ExpectNoLeakedBlocks(*gpu);
}

TEST_F(CudaFp32StoriesTest, LazyEqualsBlock) {
  auto lazy = EngineOn(CreateCudaBackend(weights_, 16, 2048, kFp32), AttentionMode::kLazy);
  auto block = EngineOn(CreateCudaBackend(weights_, 16, 2048, kFp32), AttentionMode::kBlock);
  ASSERT_TRUE(lazy && block);
  size_t tokens = 0, agreed = 0;
  double worst_error = 0;
  for (int r = 0; r < 6; ++r) {
    std::shuffle(corpus_.begin(), corpus_.end(), rng_);
    GenerateRequest request;
    const int docs = std::uniform_int_distribution<int>(2, 5)(rng_);
    request.docs.assign(corpus_.begin(), corpus_.begin() + docs);
    request.prompt = tokenizer_->Encode("One day");
    request.sampling.max_tokens = 60;
    request.record_logits = true;
    auto a = lazy->Generate(request);
    auto b = block->Generate(request);
    ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
    EXPECT_GT(a->usage.chunk_hits + a->usage.chunk_misses, 0);
    double margin = 0;
    agreed += CheckParting(*a, *b, "request " + std::to_string(r), kFp32Tie, &margin);
    tokens += b->tokens.size();
    // Block stores each chunk's keys rotated once more (in fp32 here): fp32 noise only.
    const double error = WorstLogitError(*a, *b);
    EXPECT_LT(error, kFp32Logits) << "request " << r;
    worst_error = std::max(worst_error, error);
  }
  std::printf(
      "stories260K in fp32 on the GPU: lazy and block agree on %zu of %zu greedy tokens over 6 requests; "
      "worst relative logit difference %.1e\n",
      agreed, tokens, worst_error);
  EXPECT_EQ(agreed, tokens);
  ExpectNoLeakedBlocks(*lazy);
  ExpectNoLeakedBlocks(*block);
}

// Random models in every mode: tiny-llama3 (head dim 16, rotate-half RoPE with Llama-3
// scaling) and small (head dim 64, which in bf16 would take the tensor-core kernels).
class Fp32SyntheticModelTest : public ::testing::TestWithParam<std::string> {};

TEST_P(Fp32SyntheticModelTest, LogitsWithinFp32NoiseOfCpu) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  const ModelConfig config = *SyntheticConfig(GetParam());
  const ModelWeights weights = MakeSyntheticWeights(config, seed);
  std::vector<std::vector<int32_t>> corpus = RandomDocuments(rng, config.vocab_size);
  double worst = 0;
  for (AttentionMode mode : {AttentionMode::kLazy, AttentionMode::kBlock, AttentionMode::kNone}) {
    auto gpu = EngineOn(CreateSyntheticCudaBackend(config, seed, 16, 1024, kFp32), mode);
    auto cpu = MakeEngine(weights, mode, 16, 1024);
    ASSERT_TRUE(gpu);
    for (int r = 0; r < 3; ++r) {
      const GenerateRequest request = RandomRagRequest(rng, corpus, config.vocab_size);
      auto g = gpu->Generate(request);
      auto c = cpu->Generate(request);
      ASSERT_TRUE(g.ok() && c.ok()) << g.status() << c.status();
      const double error = WorstLogitError(*g, *c);
      EXPECT_LT(error, kFp32Logits) << AttentionModeName(mode) << " request " << r;
      worst = std::max(worst, error);
    }
    ExpectNoLeakedBlocks(*gpu);
  }
  std::printf("%s in fp32: worst relative logit difference GPU vs CPU %.2e\n", GetParam().c_str(), worst);
}

INSTANTIATE_TEST_SUITE_P(Models, Fp32SyntheticModelTest, ::testing::Values("tiny-llama3", "small"),
                         SyntheticModelParamName);

// A chunk computed on the GPU in fp32 has the fp32 CPU's fingerprint and layout: its
// payload equals the CPU's to fp32 noise, and each backend's payload imports into the
// other's pool and exports again byte for byte.
TEST(CudaFp32BackendTest, ChunksMoveBetweenGpuAndCpu) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  const ModelConfig config = *SyntheticConfig("small");
  auto gpu = CreateSyntheticCudaBackend(config, seed, 16, 64, kFp32);
  auto cpu = CreateCpuBackend(MakeSyntheticWeights(config, seed), 16, 64);
  ASSERT_TRUE(gpu.ok() && cpu.ok()) << gpu.status() << cpu.status();
  EXPECT_EQ((*gpu)->kv_dtype(), "fp32");
  EXPECT_EQ((*gpu)->model_fingerprint(), (*cpu)->model_fingerprint());
  EXPECT_EQ((*gpu)->kv_bytes_per_block(), (*cpu)->kv_bytes_per_block());
  const std::vector<int32_t> tokens = RandomTokens(rng, 45, config.vocab_size);
  const std::vector<KvBlockRef> blocks = {{3, 16, 0}, {7, 16, 0}, {1, 13, 0}};
  const SequenceStep step{tokens, blocks, LogitsWanted::kNone};
  std::vector<std::vector<float>> unused;
  ASSERT_TRUE((*gpu)->Forward({&step, 1}, &unused).ok());
  ASSERT_TRUE((*cpu)->Forward({&step, 1}, &unused).ok());
  std::string gpu_payload, cpu_payload;
  ASSERT_TRUE((*gpu)->ExportChunk(blocks, &gpu_payload).ok());
  ASSERT_TRUE((*cpu)->ExportChunk(blocks, &cpu_payload).ok());
  ASSERT_EQ(gpu_payload.size(), cpu_payload.size());
  std::vector<float> gpu_kv(gpu_payload.size() / 4), cpu_kv(cpu_payload.size() / 4);
  std::memcpy(gpu_kv.data(), gpu_payload.data(), gpu_payload.size());
  std::memcpy(cpu_kv.data(), cpu_payload.data(), cpu_payload.size());
  EXPECT_LT(RelativeError(gpu_kv, cpu_kv), 1e-5);
  // Each side's payload into the other's pool, then out again: the same bytes.
  const std::vector<KvBlockRef> other = {{40, 16, 0}, {12, 16, 0}, {63, 13, 0}};
  std::string again;
  ASSERT_TRUE((*gpu)->ImportChunk(cpu_payload, other).ok());
  ASSERT_TRUE((*gpu)->ExportChunk(other, &again).ok());
  EXPECT_TRUE(again == cpu_payload);
  ASSERT_TRUE((*cpu)->ImportChunk(gpu_payload, other).ok());
  ASSERT_TRUE((*cpu)->ExportChunk(other, &again).ok());
  EXPECT_TRUE(again == gpu_payload);
  // A bf16-sized payload is refused.
  EXPECT_FALSE((*gpu)->ImportChunk(std::string_view(gpu_payload).substr(0, gpu_payload.size() / 2), other).ok());
}

}  // namespace
}  // namespace lazykv::testing
