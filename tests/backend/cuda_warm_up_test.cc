// Backend::WarmUp: on the GPU, a warmed backend meets no GEMM shape for the first time while
// it serves a batch whose steps have every kind of row count (decode steps, mixed steps,
// prefill pieces), and it computes exactly what a backend without the warm-up computes
// (the warm-up picks the same algorithm per shape, and leaves the KV pool alone). The
// argument checks run everywhere (the CPU backend's warm-up does nothing but check them).
#include <algorithm>
#include <cstdio>
#include <map>
#include <random>

#include "gtest/gtest.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/skinny_gemm.h"
#include "tests/engine/engine_compare_util.h"
#include "tests/engine/engine_test_util.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/test_util.h"
#include "worker/backend/cpu_backend.h"
#include "worker/backend/cuda_backend.h"
#include "worker/model/synthetic_model.h"

namespace lazykv::testing {
namespace {

TEST(BackendWarmUpTest, RefusesEmptyShapesAndDoesNothingOnTheCpu) {
  const ModelConfig config = *SyntheticConfig("tiny");
  auto backend = CreateCpuBackend(MakeSyntheticWeights(config, 1), 16, 64);
  ASSERT_TRUE(backend.ok()) << backend.status();
  EXPECT_EQ((*backend)->WarmUp(0, 4).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*backend)->WarmUp(8, -1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE((*backend)->WarmUp(8, 0).ok());
  EXPECT_TRUE((*backend)->ProfileSummary().empty());
}

// A batch submitted at once with prefill cut into `max_prefill` pieces, so that steps mix
// decoding sequences and prefill pieces of many sizes; the results in submission order.
std::vector<GenerateResult> RunBatch(Engine& engine, const std::vector<GenerateRequest>& requests) {
  std::vector<RequestId> ids;
  for (const GenerateRequest& request : requests) {
    auto id = engine.Submit(request);
    EXPECT_TRUE(id.ok()) << id.status();
    ids.push_back(*id);
  }
  std::map<RequestId, GenerateResult> done;
  std::vector<EngineEvent> events;
  while (done.size() < requests.size()) {
    events.clear();
    engine.Step(&events);
    for (EngineEvent& e : events) {
      EXPECT_NE(e.kind, EngineEvent::Kind::kFailed) << e.status;
      if (e.kind == EngineEvent::Kind::kFinished || e.kind == EngineEvent::Kind::kFailed) {
        done[e.id] = e.result ? *e.result : GenerateResult{};
      }
    }
  }
  std::vector<GenerateResult> results;
  for (RequestId id : ids) results.push_back(done[id]);
  return results;
}

TEST(CudaWarmUpTest, AWarmedBackendPlansNothingWhileServingAndComputesTheSame) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  const ModelConfig config = *SyntheticConfig("small");  // head dim 64: the tensor-core kernels in bf16
  std::vector<std::vector<int32_t>> corpus;
  for (int d = 0; d < 6; ++d) {
    corpus.push_back(RandomTokens(rng, std::uniform_int_distribution<int>(20, 90)(rng), config.vocab_size));
  }
  std::vector<GenerateRequest> requests;
  for (int r = 0; r < 12; ++r) {
    GenerateRequest request;
    const int docs = std::uniform_int_distribution<int>(1, 4)(rng);
    for (int d = 0; d < docs; ++d) request.docs.push_back(corpus[rng() % corpus.size()]);
    request.prompt = RandomTokens(rng, std::uniform_int_distribution<int>(1, 9)(rng), config.vocab_size);
    request.sampling.max_tokens = std::uniform_int_distribution<int>(4, 16)(rng);
    request.record_logits = true;
    request.mode = r % 3 == 2 ? AttentionMode::kBlock : AttentionMode::kLazy;
    requests.push_back(request);
  }
  EngineOptions options;
  options.max_prefill_tokens = std::uniform_int_distribution<int>(16, 48)(rng);
  options.max_running_requests = 16;
  for (CudaPrecision precision : {CudaPrecision::kBf16, CudaPrecision::kFp32}) {
    SCOPED_TRACE(precision == CudaPrecision::kBf16 ? "bf16" : "fp32");
    const CudaBackendOptions backend_options{.precision = precision};
    auto warmed_backend = CreateSyntheticCudaBackend(config, seed, 16, 1024, backend_options);
    auto cold_backend = CreateSyntheticCudaBackend(config, seed, 16, 1024, backend_options);
    ASSERT_TRUE(warmed_backend.ok() && cold_backend.ok()) << warmed_backend.status() << cold_backend.status();
    const Backend* warmed_raw = warmed_backend->get();
    const Backend* cold_raw = cold_backend->get();
    auto warmed = Engine::Create(*std::move(warmed_backend), options);
    auto cold = Engine::Create(*std::move(cold_backend), options);
    ASSERT_TRUE(warmed.ok() && cold.ok()) << warmed.status() << cold.status();
    ASSERT_TRUE((*warmed)->WarmUpBackend().ok());
    const uint64_t planned_ahead = CudaGemmPlanStats(*warmed_raw).plans;
    // Four layer GEMMs per row count up to max_prefill_tokens + max_running_requests, and
    // the classifier's up to max_running_requests; in bf16 the row counts of the skinny
    // kernels plan nothing (the model's widths are multiples of 8).
    const uint64_t skinny = precision != CudaPrecision::kBf16 ? 0
                            : cuda::SkinnyMmaByDefault()      ? cuda::kSkinnyMmaFasterRows
                                                              : cuda::kSkinnyGemmFasterRows;
    const uint64_t classifier_rows = static_cast<uint64_t>(options.max_running_requests);
    EXPECT_EQ(planned_ahead, 4u * (options.max_prefill_tokens + options.max_running_requests - skinny) +
                                 (classifier_rows - std::min(skinny, classifier_rows)));
    const std::vector<GenerateResult> got = RunBatch(**warmed, requests);
    const std::vector<GenerateResult> want = RunBatch(**cold, requests);
    const GemmPlanStats warm_stats = CudaGemmPlanStats(*warmed_raw), cold_stats = CudaGemmPlanStats(*cold_raw);
    EXPECT_TRUE(warm_stats.warmed_up);
    EXPECT_EQ(warm_stats.plans_after_warm_up, 0u) << (*warmed)->backend_profile();
    EXPECT_FALSE(cold_stats.warmed_up);
    EXPECT_GT(cold_stats.plans, 8u) << "the batch met few shapes: " << (*cold)->backend_profile();
    std::printf("%s\nwithout: %s\n", (*warmed)->backend_profile().c_str(), (*cold)->backend_profile().c_str());
    for (size_t r = 0; r < requests.size(); ++r) {
      EXPECT_EQ(got[r].tokens, want[r].tokens) << "request " << r;
      EXPECT_EQ(WorstLogitError(got[r], want[r]), 0.0) << "request " << r;
    }
    ExpectNoLeakedBlocks(**warmed);
  }
}

}  // namespace
}  // namespace lazykv::testing
