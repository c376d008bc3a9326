// The engine on the CUDA backend in bf16 (the serving precision) against the CPU backend:
// greedy stories260K output against the CPU in GPU-like numerics (RAG requests in lazy
// mode), lazy against block on the GPU, logits of random synthetic models (weights drawn
// on the GPU) within bf16 tolerance of the CPU's, and a chunk's export and import against the
// CPU's KV (the split transfer: cuda_chunk_transfer_test.cc). Skips without a GPU (and the stories tests without
// ../shared/models). Exact greedy equality with the fp32 CPU is the fp32 mode's test (cuda_fp32_backend_test.cc): in
// bf16 it cannot hold at near-ties, as follows.
//
// Precision: the GPU runs bf16 weights, bf16 GEMM inputs and a bf16 KV pool with fp32
// accumulation. The greedy reference is the CPU backend in its GPU-like numerics
// (CpuNumerics::kBf16LikeCuda: bf16 at exactly the GPU's rounding points, but for the norms
// that small decode steps take inside their GEMMs, which round gain * x before the norm's
// scale: one more difference of a bf16 step's order, as below); agreement with
// the fp32 CPU and with the fp32 CPU on bf16 weights is printed alongside. What is left
// between GPU and reference is fp32 arithmetic order (and the GPU's fast-math sin, exp,
// rsqrt), ~1e-7 relative before rounding; but where that moves a value across a bf16
// rounding boundary, the value changes by a whole bf16 step, and such flips cascade
// through the later roundings. On stories260K two CPU runs in GPU-like numerics that
// differ only in GEMM summation order (float partial sums vs double) differ by up to
// ~1e-2 of the largest logit and part at the same near-ties as the GPU (margins ~1e-3 at
// request 0 token 22, request 2 token 40, request 3 token 30), whereas in fp32 the same
// change moves the logits by 6e-7. So no reference can pin the GPU's choice at those
// near-ties; the checks are: the free-running paths agree over at least 100 tokens on some
// request and 200 in total, wherever they part the reference's logit for the other path's
// token is within kTieTolerance of its best (a near-tie, not a wrong computation); and
// along the whole of the GPU's path on every request (the reference teacher-forced with
// the GPU's tokens), the reference's choice is the GPU's or a near-tie, with logits within
// bf16 noise (the fp32 CPU against the GPU-like one: up to 1.5e-2).
#include "worker/backend/cuda_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/engine/engine_compare_util.h"
#include "tests/engine/engine_test_util.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/test_util.h"
#include "worker/backend/cpu_backend.h"
#include "worker/model/llama2c_loader.h"
#include "worker/model/synthetic_model.h"
#include "worker/tokenizer/tokenizer.h"

namespace lazykv::testing {
namespace {

// The weights as the GPU holds them (matrices in bf16, norm weights fp32), for an
// otherwise fp32 CPU backend.
ModelWeights MatricesRoundedToBf16(ModelWeights w) {
  ForEachTensor(w, [](const std::string& name, std::vector<float>& t, size_t) {
    if (name.ends_with("norm")) return;
    for (float& v : t) v = __bfloat162float(__float2bfloat16(v));
  });
  return w;
}

absl::StatusOr<std::unique_ptr<Backend>> GpuLikeCpu(const ModelWeights& weights, int num_blocks) {
  return CreateCpuBackend(weights, 16, num_blocks, CpuBackendOptions{.numerics = CpuNumerics::kBf16LikeCuda});
}

// Relative to the largest |logit| of the step (bf16 logits on these models err by ~1e-2).
constexpr double kTieTolerance = 2e-2;

// `reference` teacher-forced along `got`'s greedy path: at every step, the reference's
// logits after the same prefix (the request's prompt extended by got's tokens so far).
struct ForcedPath {
  size_t steps = 0, same_choice = 0;  // steps where the reference's argmax is got's token
  double worst_margin = 0;            // the reference's preference for its own token, relative
  double worst_error = 0;             // relative logit difference
};

ForcedPath FollowPath(Engine& reference, const GenerateRequest& request, const GenerateResult& got) {
  ForcedPath f;
  for (size_t k = 0; k < got.tokens.size() && k < got.step_logits.size(); ++k) {
    GenerateRequest forced = request;
    forced.prompt.insert(forced.prompt.end(), got.tokens.begin(), got.tokens.begin() + k);
    forced.sampling.max_tokens = 1;
    forced.record_logits = true;
    auto r = reference.Generate(forced);
    EXPECT_TRUE(r.ok() && !r->step_logits.empty()) << r.status();
    if (!r.ok() || r->step_logits.empty()) break;
    const std::vector<float>& logits = r->step_logits[0];
    const size_t best = std::max_element(logits.begin(), logits.end()) - logits.begin();
    ++f.steps;
    f.same_choice += static_cast<int32_t>(best) == got.tokens[k];
    f.worst_margin = std::max(f.worst_margin, RelativeMargin(logits, static_cast<int32_t>(best), got.tokens[k]));
    f.worst_error = std::max(f.worst_error, RelativeError(got.step_logits[k], logits));
  }
  return f;
}

TEST(CudaBackendTest, StoriesGreedyMatchesCpu) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  if (!HaveModel("stories260K.bin") || !HaveModel("tok512.bin")) GTEST_SKIP() << "no ../shared/models";
  auto weights = LoadLlama2cCheckpoint(ModelPath("stories260K.bin"));
  auto tokenizer = LoadTokenizer(ModelPath("tok512.bin"));
  ASSERT_TRUE(weights.ok() && tokenizer.ok());
  auto gpu = EngineOn(CreateCudaBackend(*weights, 16, 1024), AttentionMode::kLazy);
  auto cpu_like = EngineOn(GpuLikeCpu(*weights, 1024), AttentionMode::kLazy);
  auto cpu_bf16 = MakeEngine(MatricesRoundedToBf16(*weights), AttentionMode::kLazy);
  auto cpu_fp32 = MakeEngine(*weights, AttentionMode::kLazy);
  ASSERT_TRUE(gpu && cpu_like);
  std::vector<std::vector<int32_t>> corpus;
  for (const auto& text : StoryTexts()) corpus.push_back((*tokenizer)->Encode(text));
  size_t agreed = 0, longest = 0, bf16_agreed = 0, fp32_agreed = 0, total = 0;
  double worst_margin = 0, worst_error = 0;
  const std::vector<std::string> prompts = {"Once upon a time", "One day", "The little bird", "Max and Lily"};
  for (size_t r = 0; r < prompts.size(); ++r) {
    GenerateRequest request;
    for (size_t d = 0; d < 3; ++d) request.docs.push_back(corpus[(r + d) % corpus.size()]);
    request.prompt = (*tokenizer)->Encode(prompts[r]);
    request.sampling.max_tokens = 120;
    request.record_logits = true;
    auto g = gpu->Generate(request);
    auto c = cpu_like->Generate(request);
    auto b = cpu_bf16->Generate(request);
    auto f = cpu_fp32->Generate(request);
    ASSERT_TRUE(g.ok() && c.ok() && b.ok() && f.ok()) << g.status() << c.status() << b.status() << f.status();
    double margin = 0;
    const size_t common = CheckParting(*g, *c, "request " + std::to_string(r), kTieTolerance, &margin);
    const double error = WorstLogitError(*g, *c);
    const size_t with_bf16 = CommonPrefix(g->tokens, b->tokens), with_fp32 = CommonPrefix(g->tokens, f->tokens);
    std::printf(
        "request %zu (%s): %zu of %zu greedy tokens equal to the GPU-like CPU's%s (margin at parting %.1e, "
        "worst relative logit difference %.1e); with the fp32 CPU on bf16 weights %zu, on fp32 weights %zu\n",
        r, prompts[r].c_str(), common, c->tokens.size(), common == c->tokens.size() ? ", all" : "", margin, error,
        with_bf16, with_fp32);
    // Every step of the GPU's path, partings or not: the reference on the same prefix makes
    // the same choice or a near-tie one, with logits within bf16 noise.
    const ForcedPath forced = FollowPath(*cpu_like, request, *g);
    std::printf(
        "  along the GPU's path: the GPU-like CPU chooses the same token at %zu of %zu steps (worst margin "
        "for its own choice %.1e), worst relative logit difference %.1e\n",
        forced.same_choice, forced.steps, forced.worst_margin, forced.worst_error);
    EXPECT_EQ(forced.steps, g->tokens.size()) << "request " << r;
    EXPECT_LT(forced.worst_margin, kTieTolerance) << "request " << r;
    EXPECT_LT(forced.worst_error, 3e-2) << "request " << r;
    worst_margin = std::max(worst_margin, margin);
    worst_error = std::max(worst_error, error);
    agreed += common;
    longest = std::max(longest, common);
    total += c->tokens.size();
    bf16_agreed += with_bf16;
    fp32_agreed += with_fp32;
  }
  std::printf(
      "stories260K greedy: %zu of %zu tokens equal to the CPU backend in GPU-like numerics before the paths "
      "part, longest run %zu (worst parting margin %.1e, worst relative logit difference %.1e); against the "
      "fp32 CPU on bf16 weights %zu, on fp32 weights %zu\n",
      agreed, total, longest, worst_margin, worst_error, bf16_agreed, fp32_agreed);
  EXPECT_GE(longest, 100u);
  EXPECT_GE(agreed, 200u);
  EXPECT_LT(worst_error, 3e-2);  // bf16 noise (~1e-2, see above); a wrong computation is of order 1
}

TEST(CudaBackendTest, LazyEqualsBlockOnStories) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  if (!HaveModel("stories260K.bin") || !HaveModel("tok512.bin")) GTEST_SKIP() << "no ../shared/models";
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  auto weights = LoadLlama2cCheckpoint(ModelPath("stories260K.bin"));
  auto tokenizer = LoadTokenizer(ModelPath("tok512.bin"));
  ASSERT_TRUE(weights.ok() && tokenizer.ok());
  auto lazy = EngineOn(CreateCudaBackend(*weights, 16, 2048), AttentionMode::kLazy);
  auto block = EngineOn(CreateCudaBackend(*weights, 16, 2048), AttentionMode::kBlock);
  ASSERT_TRUE(lazy && block);
  std::vector<std::vector<int32_t>> corpus;
  for (const auto& text : StoryTexts()) corpus.push_back((*tokenizer)->Encode(text));
  size_t tokens = 0, agreed = 0, parted = 0;
  double worst_margin = 0, worst_error = 0;
  for (int r = 0; r < 6; ++r) {
    std::shuffle(corpus.begin(), corpus.end(), rng);
    GenerateRequest request;
    request.docs.assign(corpus.begin(), corpus.begin() + std::uniform_int_distribution<int>(2, 5)(rng));
    request.prompt = (*tokenizer)->Encode("One day");
    request.sampling.max_tokens = 40;
    request.record_logits = true;
    auto a = lazy->Generate(request);
    auto b = block->Generate(request);
    ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
    EXPECT_GT(a->usage.chunk_hits + a->usage.chunk_misses, 0);
    double margin = 0;
    const size_t common = CheckParting(*a, *b, "request " + std::to_string(r), kTieTolerance, &margin);
    // Block stores the rotated keys rounded to bf16 once more than lazy, and bf16 rounding
    // flips cascade over 40 steps of a 260K-parameter model: 1.5e-2 to 4.1e-2 seen on the
    // H100 (2026-11-21). The exact equality of the two modes is engine_modes_test's (fp32
    // CPU, 1e-4) and the fp32 GPU's; here a wrong rotation or mask would be of order 1.
    const double error = WorstLogitError(*a, *b);
    worst_error = std::max(worst_error, error);
    EXPECT_LT(error, 6e-2) << "request " << r << " (up to the step after the paths part)";
    worst_margin = std::max(worst_margin, margin);
    parted += common < b->tokens.size();
    agreed += common;
    tokens += b->tokens.size();
  }
  std::printf(
      "stories260K on the GPU: lazy and block agree on %zu of %zu greedy tokens over 6 requests (%zu part at "
      "a near-tie, worst margin %.1e); worst relative logit difference before parting %.1e\n",
      agreed, tokens, parted, worst_margin, worst_error);
  EXPECT_GE(agreed, 100u);
  ExpectNoLeakedBlocks(*lazy);
  ExpectNoLeakedBlocks(*block);
}

// Random models: the CUDA engine (weights drawn on the GPU) against the CPU engine on the
// same draws, every step's logits until the greedy paths part, with and without the repair;
// and lazy against block on the GPU. tiny-llama3 runs the generic attention (head dim 16), small the tensor-core
// prefill and decode kernels (head dim 64).
class SyntheticModelTest : public ::testing::TestWithParam<std::string> {};

TEST_P(SyntheticModelTest, LogitsWithinBf16ToleranceOfCpu) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  const ModelConfig config = *SyntheticConfig(GetParam());
  const ModelWeights weights = MakeSyntheticWeights(config, seed);
  std::vector<std::vector<int32_t>> corpus = RandomDocuments(rng, config.vocab_size);
  double worst_cpu = 0, worst_like = 0, worst_block = 0;
  for (AttentionMode mode : {AttentionMode::kLazy, AttentionMode::kBlock, AttentionMode::kNone}) {
    auto gpu = EngineOn(CreateSyntheticCudaBackend(config, seed, 16, 1024), mode);
    auto gpu_block = EngineOn(CreateSyntheticCudaBackend(config, seed, 16, 1024), AttentionMode::kBlock);
    auto cpu = MakeEngine(weights, mode);
    auto cpu_like = EngineOn(GpuLikeCpu(weights, 1024), mode);
    ASSERT_TRUE(gpu && gpu_block && cpu_like);
    for (int r = 0; r < 4; ++r) {
      GenerateRequest request = RandomRagRequest(rng, corpus, config.vocab_size);
      // The repair: own tokens between chunks, and a chunk block's rest copied from a slot
      // offset (materialize with first_slots).
      if (r >= 2) request.repair_tokens = std::uniform_int_distribution<int>(1, 40)(rng);
      auto g = gpu->Generate(request);
      auto c = cpu->Generate(request);
      auto b = gpu_block->Generate(request);
      auto l = cpu_like->Generate(request);
      ASSERT_TRUE(g.ok() && c.ok() && b.ok() && l.ok()) << g.status() << c.status() << b.status() << l.status();
      worst_like = std::max(worst_like, WorstLogitError(*g, *l));
      const double error = WorstLogitError(*g, *c);
      worst_cpu = std::max(worst_cpu, error);
      EXPECT_LT(error, 3e-2) << AttentionModeName(mode) << " request " << r;
      if (mode == AttentionMode::kLazy) {
        const double block_error = WorstLogitError(*g, *b);
        worst_block = std::max(worst_block, block_error);
        EXPECT_LT(block_error, 3e-2) << "lazy vs block, request " << r;
      }
    }
    ExpectNoLeakedBlocks(*gpu);
  }
  std::printf(
      "%s: worst relative logit error GPU vs CPU %.2e (vs the CPU in GPU-like numerics %.2e), GPU lazy vs "
      "GPU block %.2e\n",
      GetParam().c_str(), worst_cpu, worst_like, worst_block);
}

INSTANTIATE_TEST_SUITE_P(Models, SyntheticModelTest, ::testing::Values("tiny", "tiny-llama3", "small"),
                         SyntheticModelParamName);

// 12 requests over a corpus of 6 documents of doc_tokens.first .. doc_tokens.second tokens: 1 to
// max_docs documents each (two in three from the corpus's first hot_docs where hot_docs > 0, any
// else), a prompt of 1-9 tokens, max_tokens greedy tokens with their logits recorded; every
// fourth request in block mode (which shares no chunk blocks), the others lazy.
std::vector<GenerateRequest> RandomBatch(std::mt19937_64& rng, int vocab, std::pair<int, int> doc_tokens, int max_docs,
                                         int hot_docs, int max_tokens) {
  std::vector<std::vector<int32_t>> corpus;
  for (int d = 0; d < 6; ++d) {
    corpus.push_back(
        RandomTokens(rng, std::uniform_int_distribution<int>(doc_tokens.first, doc_tokens.second)(rng), vocab));
  }
  std::vector<GenerateRequest> requests;
  for (int r = 0; r < 12; ++r) {
    GenerateRequest request;
    const int docs = std::uniform_int_distribution<int>(1, max_docs)(rng);
    for (int d = 0; d < docs; ++d) {
      const bool hot = hot_docs > 0 && rng() % 3 != 0;
      request.docs.push_back(corpus[hot ? rng() % hot_docs : rng() % corpus.size()]);
    }
    request.prompt = RandomTokens(rng, std::uniform_int_distribution<int>(1, 9)(rng), vocab);
    request.sampling.max_tokens = max_tokens;
    request.record_logits = true;
    request.mode = r % 4 == 3 ? AttentionMode::kBlock : AttentionMode::kLazy;
    requests.push_back(request);
  }
  return requests;
}

// A batch's GPU results against the CPU's, request by request: logits within bf16 noise (as in
// SyntheticModelTest) and greedy tokens equal up to near-ties, for at least 70% of the tokens.
struct BatchAgreement {
  size_t same = 0, total = 0;
  double worst = 0;  // the worst relative logit difference
};
BatchAgreement ExpectBatchAgrees(const std::vector<GenerateResult>& gpu, const std::vector<GenerateResult>& cpu) {
  BatchAgreement a;
  for (size_t r = 0; r < cpu.size(); ++r) {
    const double error = WorstLogitError(gpu[r], cpu[r]);
    a.worst = std::max(a.worst, error);
    EXPECT_LT(error, 3e-2) << "request " << r;
    double margin = 0;
    a.same += CheckParting(gpu[r], cpu[r], "request " + std::to_string(r), kTieTolerance, &margin);
    a.total += cpu[r].tokens.size();
  }
  EXPECT_GT(a.total, 0u);
  EXPECT_GE(a.same * 10, a.total * 7) << "greedy paths part early: " << a.same << " of " << a.total;
  return a;
}

// Runs `requests` at once on `backend`, prefill cut into pieces of at most max_prefill_tokens;
// `inspect` sees the backend once they are done. The results in request order.
std::vector<GenerateResult> RunBatch(absl::StatusOr<std::unique_ptr<Backend>> backend,
                                     const std::vector<GenerateRequest>& requests, int max_prefill_tokens,
                                     const std::function<void(const Backend&)>& inspect) {
  EXPECT_TRUE(backend.ok()) << backend.status();
  if (!backend.ok()) return std::vector<GenerateResult>(requests.size());
  const Backend* raw = backend->get();
  EngineOptions options;
  options.max_prefill_tokens = max_prefill_tokens;
  auto engine = Engine::Create(*std::move(backend), options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return std::vector<GenerateResult>(requests.size());
  std::vector<RequestId> ids;
  for (const GenerateRequest& request : requests) ids.push_back(*(*engine)->Submit(request));
  std::map<RequestId, GenerateResult> done;
  std::vector<EngineEvent> events;
  while (done.size() < requests.size()) {
    events.clear();
    (*engine)->Step(&events);
    for (EngineEvent& e : events) {
      EXPECT_NE(e.kind, EngineEvent::Kind::kFailed) << e.status;
      if (e.kind == EngineEvent::Kind::kFinished) done[e.id] = *e.result;
      if (e.kind == EngineEvent::Kind::kFailed) done[e.id] = GenerateResult{};
    }
  }
  inspect(*raw);
  ExpectNoLeakedBlocks(**engine);
  std::vector<GenerateResult> results;
  for (RequestId id : ids) results.push_back(done[id]);
  return results;
}

// Decode kernels inside batched steps: a batch of requests drawing their documents from a
// small corpus, submitted at once, so that steps mix decoding sequences (which run the decode
// kernels, and share chunk blocks at different positions) with prefill pieces. Three CUDA
// engines over the same weights (chunk-shared decode always on; off; and every row of a
// mixed step through the prefill kernel, the former path) against the CPU engine in
// GPU-like numerics on the same batch: the same tokens up to near-ties and logits within
// bf16 noise, and the shared path really ran.
TEST(CudaBackendTest, DecodeKernelsInMixedAndSharedStepsEqualTheCpu) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  const ModelConfig config = *SyntheticConfig("small");  // head dim 64: the tensor-core kernels
  const ModelWeights weights = MakeSyntheticWeights(config, seed);
  // Most requests draw from two hot documents, so that decoding sequences share chunk blocks.
  const std::vector<GenerateRequest> requests =
      RandomBatch(rng, config.vocab_size, /*doc_tokens=*/{20, 90}, /*max_docs=*/4, /*hot_docs=*/2, /*max_tokens=*/12);
  // The batch at once (prefill cut into 32-token pieces, so that prefill and decoding sequences
  // meet in one step).
  auto run = [&](absl::StatusOr<std::unique_ptr<Backend>> backend, SharedDecodeStats* stats) {
    return RunBatch(std::move(backend), requests, /*max_prefill_tokens=*/32, [&](const Backend& raw) {
      if (stats != nullptr) *stats = CudaSharedDecodeStats(raw);
    });
  };
  const std::vector<GenerateResult> cpu = run(GpuLikeCpu(weights, 2048), nullptr);
  struct Variant {
    const char* name;
    CudaBackendOptions options;
  };
  for (const Variant& v :
       {Variant{"shared", CudaBackendOptions{.shared_decode = SharedDecode::kAlways}},
        Variant{"per-sequence", CudaBackendOptions{.shared_decode = SharedDecode::kOff}},
        Variant{"prefill kernel for mixed steps",
                CudaBackendOptions{.shared_decode = SharedDecode::kOff, .decode_in_mixed_steps = false}},
        // The KV write's rotated query in every prefill step, beside decoding rows (whose query
        // must stay raw) and for every row of a mixed step.
        Variant{"query rotated by the KV write",
                CudaBackendOptions{.shared_decode = SharedDecode::kAlways, .rotated_query = RotatedQuery::kAlways}},
        Variant{"query rotated by the KV write, prefill kernel for mixed steps",
                CudaBackendOptions{.shared_decode = SharedDecode::kOff,
                .decode_in_mixed_steps = false,
                .rotated_query = RotatedQuery::kAlways}}}) {
    SCOPED_TRACE(v.name);
    SharedDecodeStats stats;
    const std::vector<GenerateResult> gpu = run(CreateCudaBackend(weights, 16, 2048, v.options), &stats);
    EXPECT_EQ(stats.steps > 0, v.options.shared_decode == SharedDecode::kAlways) << stats.steps;
    const BatchAgreement a = ExpectBatchAgrees(gpu, cpu);
    std::printf(
        "%s: %llu decode steps shared (%llu KV tokens per layer not read again); %zu of %zu tokens equal to "
        "the CPU's, worst relative logit difference %.2e\n",
        v.name, static_cast<unsigned long long>(stats.steps), static_cast<unsigned long long>(stats.tokens_saved),
        a.same, a.total, a.worst);
  }
}

// Few-query sequences beside longer ones: documents of 65-200 tokens, so that their encodings
// (pieces of more than 64 queries) and the prompts over cached ones (1-9 queries) meet in steps
// of up to 256 prefill tokens, in the engine's order. Those steps run two prefill launches (the
// few-query sequences packed, RunModel laying them out first), and every step's logits equal
// the CPU engine's in GPU-like numerics within bf16 noise, with the same tokens up to near-ties:
// with the default options (this model's launches are too small for the persistent kernel),
// with the query rotated by the KV write in every prefill launch, with every row of a mixed step
// through the prefill kernel, and with the persistent kernel taken from 1 work tile (both
// launches: its bf16 output and work starts a launch) and from 25 (where a drawn batch has such a
// launch, some steps' longer launch only: the bf16 output and rotated query from the second launch
// on; never more launches than from 1).
TEST(CudaBackendTest, FewQuerySequencesBesideLongOnesEqualTheCpu) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  const ModelConfig config = *SyntheticConfig("small");  // head dim 64, 4 query heads a KV head: packs
  const ModelWeights weights = MakeSyntheticWeights(config, seed);
  const std::vector<GenerateRequest> requests =
      RandomBatch(rng, config.vocab_size, /*doc_tokens=*/{65, 200}, /*max_docs=*/3, /*hot_docs=*/0, /*max_tokens=*/8);
  constexpr int kMaxPrefillTokens = 256;
  const std::vector<GenerateResult> cpu =
      RunBatch(GpuLikeCpu(weights, 4096), requests, kMaxPrefillTokens, [](const Backend&) {});
  uint64_t persistent_from_one = 0;
  for (const CudaBackendOptions& options :
       {CudaBackendOptions{}, CudaBackendOptions{.rotated_query = RotatedQuery::kAlways},
        CudaBackendOptions{.decode_in_mixed_steps = false}, CudaBackendOptions{.prefill_persistent_min_work_tiles = 1},
        CudaBackendOptions{.prefill_persistent_min_work_tiles = 25}}) {
    SCOPED_TRACE(::testing::Message() << "persistent from " << options.prefill_persistent_min_work_tiles
                                      << " work tiles, mixed steps' decoding rows "
                                      << (options.decode_in_mixed_steps ? "decode" : "prefill"));
    PrefillLaunchStats stats;
    const std::vector<GenerateResult> gpu =
        RunBatch(CreateCudaBackend(weights, 16, 4096, options), requests, kMaxPrefillTokens,
                 [&](const Backend& raw) { stats = CudaPrefillLaunchStats(raw); });
    EXPECT_GT(stats.two_launch_steps, 0u) << "no step had few-query sequences beside longer ones";
    // From 1 work tile every launch takes the persistent kernel; from 25 only a launch that
    // reaches 25 work tiles does, which depends on the drawn batch (seeds gave 0 and 2 such launches).
    if (options.prefill_persistent_min_work_tiles == 0) {
      EXPECT_EQ(stats.persistent_launches, 0u);
    } else if (options.prefill_persistent_min_work_tiles == 1) {
      EXPECT_GT(stats.persistent_launches, 0u);
      persistent_from_one = stats.persistent_launches;
    } else {
      EXPECT_LE(stats.persistent_launches, persistent_from_one);
    }
    const BatchAgreement a = ExpectBatchAgrees(gpu, cpu);
    std::printf(
        "persistent from %d work tiles: two prefill launches in %llu steps (%llu of them on different kernels), "
        "%llu persistent launches; %zu of %zu tokens equal to the CPU's, worst relative logit difference %.2e\n",
        options.prefill_persistent_min_work_tiles, static_cast<unsigned long long>(stats.two_launch_steps),
        static_cast<unsigned long long>(stats.mixed_kernel_steps),
        static_cast<unsigned long long>(stats.persistent_launches), a.same, a.total, a.worst);
  }
}

// A chunk computed on the GPU, exported (bf16 payload) against the CPU backend's export
// (fp32) of the same tokens; imported into other blocks from pageable and from pinned
// memory and exported again: the same bytes.
TEST(CudaBackendTest, ChunkExportImportRoundTrip) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  const ModelConfig config = *SyntheticConfig("small");
  auto gpu = CreateSyntheticCudaBackend(config, seed, 16, 64);
  auto cpu = CreateCpuBackend(MakeSyntheticWeights(config, seed), 16, 64);
  ASSERT_TRUE(gpu.ok() && cpu.ok()) << gpu.status() << cpu.status();
  EXPECT_EQ((*gpu)->kv_dtype(), "bf16");
  EXPECT_NE((*gpu)->model_fingerprint(), (*cpu)->model_fingerprint());  // KV dtype is part of it
  const std::vector<int32_t> tokens = RandomTokens(rng, 45, config.vocab_size);
  const std::vector<KvBlockRef> blocks = {{3, 16, 0}, {7, 16, 0}, {1, 13, 0}};
  const SequenceStep step{tokens, blocks, LogitsWanted::kNone};
  std::vector<std::vector<float>> unused;
  ASSERT_TRUE((*gpu)->Forward({&step, 1}, &unused).ok());
  ASSERT_TRUE((*cpu)->Forward({&step, 1}, &unused).ok());
  std::string gpu_payload, cpu_payload;
  ASSERT_TRUE((*gpu)->ExportChunk(blocks, &gpu_payload).ok());
  ASSERT_TRUE((*cpu)->ExportChunk(blocks, &cpu_payload).ok());
  ASSERT_EQ(gpu_payload.size() * 2, cpu_payload.size());
  std::vector<float> gpu_kv(gpu_payload.size() / 2), cpu_kv(cpu_payload.size() / 4);
  for (size_t i = 0; i < gpu_kv.size(); ++i) {
    gpu_kv[i] = __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(gpu_payload.data())[i]);
  }
  std::memcpy(cpu_kv.data(), cpu_payload.data(), cpu_payload.size());
  EXPECT_LT(RelativeError(gpu_kv, cpu_kv), 2e-2);
  // The CPU in GPU-like numerics stores bf16 KV too: the same fingerprint, the same layout.
  auto cpu_like = GpuLikeCpu(MakeSyntheticWeights(config, seed), 64);
  ASSERT_TRUE(cpu_like.ok()) << cpu_like.status();
  EXPECT_EQ((*cpu_like)->model_fingerprint(), (*gpu)->model_fingerprint());
  ASSERT_TRUE((*cpu_like)->Forward({&step, 1}, &unused).ok());
  std::string like_payload;
  ASSERT_TRUE((*cpu_like)->ExportChunk(blocks, &like_payload).ok());
  ASSERT_EQ(like_payload.size(), gpu_payload.size());
  std::vector<float> like_kv(gpu_kv.size());
  size_t same_bits = 0;
  for (size_t i = 0; i < like_kv.size(); ++i) {
    const uint16_t a = reinterpret_cast<const uint16_t*>(gpu_payload.data())[i];
    const uint16_t b = reinterpret_cast<const uint16_t*>(like_payload.data())[i];
    like_kv[i] = __bfloat162float(*reinterpret_cast<const __nv_bfloat16*>(&b));
    same_bits += a == b;
  }
  std::printf("chunk KV: GPU vs fp32 CPU %.1e, vs GPU-like CPU %.1e (%.2f%% of values bit-identical)\n",
              RelativeError(gpu_kv, cpu_kv), RelativeError(gpu_kv, like_kv), 100.0 * same_bits / like_kv.size());
  EXPECT_LT(RelativeError(gpu_kv, like_kv), 2e-2);

  const std::vector<KvBlockRef> other = {{40, 16, 0}, {12, 16, 0}, {63, 13, 0}};
  ASSERT_TRUE((*gpu)->ImportChunk(gpu_payload, other).ok());  // pageable source
  std::string again;
  ASSERT_TRUE((*gpu)->ExportChunk(other, &again).ok());
  EXPECT_TRUE(again == gpu_payload);
  char* pinned = nullptr;
  CUDA_OK(cudaMallocHost(&pinned, gpu_payload.size()));
  std::memcpy(pinned, gpu_payload.data(), gpu_payload.size());
  const std::vector<KvBlockRef> third = {{20, 16, 0}, {21, 16, 0}, {22, 13, 0}};
  ASSERT_TRUE((*gpu)->ImportChunk(std::string_view(pinned, gpu_payload.size()), third).ok());
  ASSERT_TRUE((*gpu)->ExportChunk(third, &again).ok());
  EXPECT_TRUE(again == gpu_payload);
  cudaFreeHost(pinned);
  // A payload that does not match the blocks is refused.
  EXPECT_FALSE((*gpu)->ImportChunk(std::string_view(gpu_payload).substr(2), third).ok());
}

}  // namespace
}  // namespace lazykv::testing
