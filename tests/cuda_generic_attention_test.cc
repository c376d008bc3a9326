// The generic lazy paged attention (any head dim) against the CPU reference
// (LazyPagedAttention): several sequences, each with chunks at random deltas up to 128k,
// own tokens already cached, then a run of new queries (one query: decode), partly filled
// blocks, odd block sizes, GQA groups 1 to 8, both RoPE styles. Output poisoned first.
// Skips without a GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/paged_attention.h"
#include "kernels/cuda/generic_attention.h"
#include "tests/cuda_test_util.h"
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
  RopeConfig rope;
  rope.style = s.style;
  rope.theta = s.style == RopeStyle::kInterleaved ? 10000.0 : 500000.0;
  rope.llama3_scaling = s.style == RopeStyle::kRotateHalf;
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };

  std::vector<int32_t> ids, tokens, deltas, starts, offsets = {0}, q_offsets = {0}, pos0;
  std::vector<std::vector<KvBlockRef>> tables(s.num_seqs);
  int32_t next_block = 0;
  int max_queries = 0;
  for (int seq = 0; seq < s.num_seqs; ++seq) {
    int32_t logical = 0;
    auto add = [&](int len, int32_t delta) {
      for (int done = 0; done < len; done += s.block_size) {
        const int fill = std::min(s.block_size, len - done);
        tables[seq].push_back(KvBlockRef{next_block, fill, delta});
        ids.push_back(next_block++);
        tokens.push_back(fill);
        deltas.push_back(delta);
        starts.push_back(logical);
        logical += fill;
      }
    };
    const int chunks = uniform(0, s.chunks);
    for (int c = 0; c < chunks; ++c) add(uniform(1, s.max_chunk_tokens), uniform(1, 131072));
    const int prior = uniform(0, 20), queries = uniform(1, s.max_queries);
    add(prior + queries, 0);  // own tokens (delta 0), the last `queries` of them new
    offsets.push_back(static_cast<int32_t>(ids.size()));
    pos0.push_back(logical - queries);
    q_offsets.push_back(q_offsets.back() + queries);
    max_queries = std::max(max_queries, queries);
  }
  const int total_queries = q_offsets.back();
  const size_t pool = static_cast<size_t>(next_block) * s.block_size * s.n_kv_heads * s.head_dim;
  std::vector<__nv_bfloat16> k_bf, v_bf;
  std::vector<float> k_fp, v_fp;
  RandomBf16(rng, pool, k_bf, k_fp);
  RandomBf16(rng, pool, v_bf, v_fp);
  const size_t q_width = static_cast<size_t>(s.n_heads) * s.head_dim;
  std::normal_distribution<float> dist;
  std::vector<float> q(total_queries * q_width);
  for (float& x : q) x = dist(rng);

  const cpu::RopeTable table(rope, s.head_dim);
  const cpu::KvLayerView kv{k_fp.data(), v_fp.data(), next_block, s.block_size, s.n_kv_heads, s.head_dim};
  std::vector<float> expected(q.size());
  for (int seq = 0; seq < s.num_seqs; ++seq) {
    const int n = q_offsets[seq + 1] - q_offsets[seq];
    std::vector<int32_t> positions(n);
    for (int i = 0; i < n; ++i) positions[i] = pos0[seq] + i;
    cpu::LazyPagedAttention(q.data() + q_offsets[seq] * q_width, positions.data(), n, s.n_heads, tables[seq], kv,
                            table, expected.data() + q_offsets[seq] * q_width);
  }

  cuda::PrefillAttentionParams p;
  p.q = ToDevice(q);
  p.k_pool = ToDevice(k_bf);
  p.v_pool = ToDevice(v_bf);
  p.block_ids = ToDevice(ids);
  p.block_tokens = ToDevice(tokens);
  p.block_deltas = ToDevice(deltas);
  p.block_starts = ToDevice(starts);
  p.table_offsets = ToDevice(offsets);
  p.query_offsets = ToDevice(q_offsets);
  p.query_pos0 = ToDevice(pos0);
  p.inv_freq = ToDevice(RopeInverseFrequencies(rope, s.head_dim));
  p.num_seqs = s.num_seqs;
  p.n_heads = s.n_heads;
  p.n_kv_heads = s.n_kv_heads;
  p.head_dim = s.head_dim;
  p.block_size = s.block_size;
  p.rope_style = s.style == RopeStyle::kInterleaved ? 0 : 1;
  p.max_queries_per_seq = max_queries;
  CUDA_OK(cudaMalloc(&p.out, q.size() * sizeof(float)));
  CUDA_OK(cudaMemset(p.out, 0xff, q.size() * sizeof(float)));
  CUDA_OK(cuda::LaunchGenericPagedAttention(p, total_queries, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  const auto got = ToHost(p.out, q.size());
  // fp32 arithmetic on both sides (bf16 K/V are exact in fp32): only summation order and
  // the fast exp differ.
  for (int seq = 0; seq < s.num_seqs; ++seq) {
    const auto b = got.begin() + q_offsets[seq] * q_width, e = got.begin() + q_offsets[seq + 1] * q_width;
    const auto eb = expected.begin() + q_offsets[seq] * q_width, ee = expected.begin() + q_offsets[seq + 1] * q_width;
    EXPECT_LT(RelativeError(std::vector<float>(b, e), std::vector<float>(eb, ee)), 1e-4) << "sequence " << seq;
  }
  for (const void* ptr : {(const void*)p.q, p.k_pool, p.v_pool, (const void*)p.block_ids, (const void*)p.block_tokens,
                          (const void*)p.block_deltas, (const void*)p.block_starts, (const void*)p.table_offsets,
                          (const void*)p.query_offsets, (const void*)p.query_pos0, (const void*)p.inv_freq,
                          (const void*)p.out}) {
    cudaFree(const_cast<void*>(ptr));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GenericAttentionGpuTest,
    ::testing::Values(Shape{8, 8, 4, 16, 3, 4, 40, 30, RopeStyle::kInterleaved},    // stories260K
                      Shape{8, 8, 4, 16, 4, 3, 20, 1, RopeStyle::kInterleaved},     // its decode
                      Shape{16, 4, 1, 5, 2, 5, 33, 17, RopeStyle::kRotateHalf},     // tiny-llama3, odd blocks
                      Shape{96, 12, 4, 7, 2, 3, 150, 9, RopeStyle::kRotateHalf},    // group 3, head dim 96
                      Shape{128, 32, 8, 16, 2, 4, 300, 140, RopeStyle::kRotateHalf},  // > 128 keys per entry run
                      Shape{64, 8, 8, 256, 2, 2, 600, 5, RopeStyle::kInterleaved},  // MHA, big blocks
                      Shape{256, 4, 2, 3, 1, 2, 10, 4, RopeStyle::kInterleaved}),   // head dim 256
    [](const ::testing::TestParamInfo<Shape>& info) {
      const Shape& s = info.param;
      return "hd" + std::to_string(s.head_dim) + "_group" + std::to_string(s.n_heads / s.n_kv_heads) + "_block" +
             std::to_string(s.block_size) + "_q" + std::to_string(s.max_queries);
    });

}  // namespace
}  // namespace lazykv::testing
