// The generic lazy paged attention (any head dim) against the CPU reference
// (LazyPagedAttention): several sequences, each with chunks at random deltas up to 128k,
// own tokens already cached, then a run of new queries (one query: decode), partly filled
// blocks, odd block sizes, GQA groups 1 to 8, both RoPE styles; on a bf16 pool and on an
// fp32 one (the CUDA backend's fp32 mode). Output poisoned first. Skips without a GPU.
#include <cuda_runtime.h>

#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/generic_attention.h"
#include "tests/kernels/cuda_paged_problem.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/test_util.h"

namespace lazykv::testing {
namespace {

struct Shape {
  int head_dim, n_heads, n_kv_heads, block_size, num_seqs, chunks, max_chunk_tokens, max_queries;
  RopeStyle style;
};

class GenericAttentionGpuTest : public ::testing::TestWithParam<Shape> {};

TEST_P(GenericAttentionGpuTest, MatchesCpuReference) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  const Shape s = GetParam();
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  PagedProblem problem(s.n_heads, s.n_kv_heads, s.head_dim, s.block_size, s.style);
  for (int seq = 0; seq < s.num_seqs; ++seq) {
    const int chunks = uniform(0, s.chunks);
    for (int c = 0; c < chunks; ++c) problem.AddSegment(uniform(1, s.max_chunk_tokens), uniform(1, 131072));
    const int prior = uniform(0, 20), queries = uniform(1, s.max_queries);
    problem.AddSegment(prior + queries, 0);  // own tokens (delta 0), the last `queries` of them new
    problem.EndSequence(queries);
  }
  problem.Draw(rng);
  std::vector<float> expected = problem.Reference();

  DeviceArena arena;
  cuda::PrefillAttentionParams p = problem.PrefillParams(problem.Upload(arena));
  for (const cuda::Element element : {cuda::Element::kBf16, cuda::Element::kFp32}) {
    SCOPED_TRACE(cuda::ElementName(element));
    if (element == cuda::Element::kFp32) {
      // Values off the bf16 grid (a kernel that dropped their low bits would err by ~1e-3).
      std::uniform_real_distribution<float> nudge(-1e-2f, 1e-2f);
      for (std::vector<float>* pool : {&problem.k_fp, &problem.v_fp}) {
        for (float& x : *pool) x *= 1.0f + nudge(rng);
      }
      expected = problem.Reference();
      p.kv.k_pool = arena.Copy(problem.k_fp);
      p.kv.v_pool = arena.Copy(problem.v_fp);
      p.kv.element = element;
    }
    CUDA_OK(cudaMemset(p.out, 0xff, expected.size() * sizeof(float)));  // NaN: an unwritten element fails
    CUDA_OK(cuda::LaunchGenericPagedAttention(p, problem.total_queries(), nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    const auto got = ToHost(p.out, expected.size());
    // fp32 arithmetic on both sides (bf16 K/V are exact in fp32): only summation order and
    // the fast exp differ.
    for (int seq = 0; seq < s.num_seqs; ++seq) {
      EXPECT_LT(RelativeError(problem.Rows(got, seq), problem.Rows(expected, seq)), 1e-4) << "sequence " << seq;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GenericAttentionGpuTest,
    ::testing::Values(Shape{8, 8, 4, 16, 3, 4, 40, 30, RopeStyle::kInterleaved},      // stories260K
                      Shape{8, 8, 4, 16, 4, 3, 20, 1, RopeStyle::kInterleaved},       // its decode
                      Shape{16, 4, 1, 5, 2, 5, 33, 17, RopeStyle::kRotateHalf},       // tiny-llama3, odd blocks
                      Shape{96, 12, 4, 7, 2, 3, 150, 9, RopeStyle::kRotateHalf},      // group 3, head dim 96
                      Shape{128, 32, 8, 16, 2, 4, 300, 140, RopeStyle::kRotateHalf},  // > 128 keys per entry run
                      Shape{64, 8, 8, 256, 2, 2, 600, 5, RopeStyle::kInterleaved},    // MHA, big blocks
                      Shape{256, 4, 2, 3, 1, 2, 10, 4, RopeStyle::kInterleaved}),     // head dim 256
    [](const ::testing::TestParamInfo<Shape>& info) {
      const Shape& s = info.param;
      return "hd" + std::to_string(s.head_dim) + "_group" + std::to_string(s.n_heads / s.n_kv_heads) + "_block" +
             std::to_string(s.block_size) + "_q" + std::to_string(s.max_queries);
    });

}  // namespace
}  // namespace lazykv::testing
