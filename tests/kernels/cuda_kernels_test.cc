// GPU kernels against the CPU reference, on fresh random inputs at several shapes (odd
// lengths, partly filled blocks, many chunks, deltas up to 128k). Skips without a GPU.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

#include "gtest/gtest.h"
#include "kernels/cpu/paged_attention.h"
#include "kernels/cuda/lazy_decode_attention.h"
#include "kernels/cuda/materialize.h"
#include "kernels/cuda/model_ops.h"
#include "tests/kernels/cuda_paged_problem.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/test_util.h"

namespace lazykv::testing {
namespace {

struct Shape {
  int head_dim, n_heads, n_kv_heads, block_size, num_seqs, chunks, max_chunk_tokens;
  RopeStyle style;
  int max_delta;
  int splits = 0;  // 0: as the launcher chooses
};

class DecodeAttentionGpuTest : public ::testing::TestWithParam<Shape> {};

TEST_P(DecodeAttentionGpuTest, MatchesCpuReference) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  const Shape s = GetParam();
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);

  // Block tables: per sequence, `chunks` chunks with random deltas (partly filled last
  // blocks), then the sequence's own blocks with delta 0, whose last token is the query.
  PagedProblem problem(s.n_heads, s.n_kv_heads, s.head_dim, s.block_size, s.style);
  for (int seq = 0; seq < s.num_seqs; ++seq) {
    for (int c = 0; c <= s.chunks; ++c) {
      const bool own = c == s.chunks;
      const int len = std::uniform_int_distribution<int>(1, s.max_chunk_tokens)(rng);
      problem.AddSegment(len, own ? 0 : std::uniform_int_distribution<int32_t>(0, s.max_delta)(rng));
    }
    problem.EndSequence(1);
  }
  problem.Draw(rng);
  const std::vector<float> expected = problem.Reference();

  // GPU, output poisoned first so that an unwritten element fails.
  DeviceArena arena;
  const DevicePagedProblem d = problem.Upload(arena);
  cuda::DecodeAttentionParams p = problem.DecodeParams(d);
  p.num_splits = s.splits;
  const int splits = cuda::ChooseDecodeSplits(p);
  p.workspace = arena.Alloc<float>(cuda::DecodeWorkspaceBytes(p, splits) / sizeof(float) + 1);
  CUDA_OK(cudaMemset(p.out, 0xff, expected.size() * sizeof(float)));  // NaN
  CUDA_OK(cuda::LaunchLazyDecodeAttention(p, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  const auto got = ToHost(p.out, expected.size());
  double worst = 0.0;
  for (int seq = 0; seq < s.num_seqs; ++seq) {
    const double error = RelativeError(problem.Rows(got, seq), problem.Rows(expected, seq));
    worst = std::max(worst, error);
    EXPECT_LT(error, 2e-3) << "sequence " << seq << " of " << s.num_seqs << ", splits " << splits;
  }
  std::printf("decode: worst relative error %.2e over %d sequences, %d splits\n", worst, s.num_seqs, splits);

  // The last split merging (DecodeAttentionParams::split_counters) instead of the combine
  // kernel: within fp32 rounding of the combine's output, counters left zero, and a second
  // launch on the same counters as right as the first.
  {
    const size_t slots = static_cast<size_t>(s.num_seqs) * s.n_kv_heads;
    cuda::DecodeAttentionParams merged = p;
    merged.split_counters = arena.Alloc<int32_t>(slots);
    CUDA_OK(cudaMemset(merged.split_counters, 0, slots * sizeof(int32_t)));
    for (int launch = 0; launch < 2; ++launch) {
      CUDA_OK(cudaMemset(p.out, 0xff, expected.size() * sizeof(float)));
      CUDA_OK(cudaMemset(p.workspace, 0xff, cuda::DecodeWorkspaceBytes(p, splits)));  // no stale partials
      CUDA_OK(cuda::LaunchLazyDecodeAttention(merged, nullptr));
      CUDA_OK(cudaDeviceSynchronize());
      const auto out = ToHost(p.out, expected.size());
      EXPECT_LT(RelativeError(out, got), 1e-5) << "launch " << launch << ", splits " << splits;
      for (int seq = 0; seq < s.num_seqs; ++seq) {
        EXPECT_LT(RelativeError(problem.Rows(out, seq), problem.Rows(expected, seq)), 2e-3)
            << "launch " << launch << ", sequence " << seq << ", splits " << splits;
      }
      const auto counters = ToHost(merged.split_counters, slots);
      EXPECT_EQ(std::count(counters.begin(), counters.end(), 0), static_cast<long>(slots))
          << "counters not left zero, launch " << launch;
    }
    // Two launches back to back on one stream (as a step's layers run them, the second
    // launched while the first runs), the second into its own poisoned output: a counter the
    // first left non-zero would keep the second from merging.
    cuda::DecodeAttentionParams second = merged;
    second.out = arena.Alloc<float>(expected.size());
    CUDA_OK(cudaMemset(second.out, 0xff, expected.size() * sizeof(float)));
    CUDA_OK(cuda::LaunchLazyDecodeAttention(merged, nullptr));
    CUDA_OK(cuda::LaunchLazyDecodeAttention(second, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    EXPECT_LT(RelativeError(ToHost(second.out, expected.size()), got), 1e-5) << "back to back, splits " << splits;
  }

  // The KV write fused into the kernel (DecodeAttentionParams::new_tokens): each sequence's
  // last token, its query's, gets a fresh key and value from random QKV rows. The kernel
  // writing them itself must leave the pools and give the output, bit for bit, of the KV
  // write kernel followed by the kernel on the queries that one split out.
  {
    const int q_width = s.n_heads * s.head_dim, kv_width = s.n_kv_heads * s.head_dim;
    std::vector<float> qkv(static_cast<size_t>(s.num_seqs) * (q_width + 2 * kv_width));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& x : qkv) x = normal(rng);
    std::vector<int32_t> slot_blocks, slot_index, rope_positions;
    for (int seq = 0; seq < s.num_seqs; ++seq) {
      const int32_t last = problem.table_offsets[seq + 1] - 1;  // the sequence's own last block
      slot_blocks.push_back(problem.block_ids[last]);
      slot_index.push_back(problem.block_tokens[last] - 1);
      rope_positions.push_back(problem.query_pos0[seq] - problem.block_deltas[last]);
    }
    cuda::KvWriteParams kw;
    kw.qkv = arena.Copy(qkv);
    kw.q_out = arena.Alloc<float>(static_cast<size_t>(s.num_seqs) * q_width);
    kw.kv = problem.PoolKv(d);
    kw.slot_blocks = arena.Copy(slot_blocks);
    kw.slot_index = arena.Copy(slot_index);
    kw.rope_positions = arena.Copy(rope_positions);
    kw.rows = s.num_seqs;
    kw.n_heads = s.n_heads;
    const size_t pool = problem.k_bf.size();
    auto restore_pools = [&] {
      CUDA_OK(cudaMemcpy(d.k_pool, problem.k_bf.data(), pool * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice));
      CUDA_OK(cudaMemcpy(d.v_pool, problem.v_bf.data(), pool * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice));
    };
    auto bits = [](const std::vector<__nv_bfloat16>& v) {
      std::vector<uint16_t> out(v.size());
      std::memcpy(out.data(), v.data(), v.size() * sizeof(uint16_t));
      return out;
    };
    CUDA_OK(cuda::LaunchKvWrite(kw, nullptr));
    cuda::DecodeAttentionParams separate = p;
    separate.q = kw.q_out;
    CUDA_OK(cudaMemset(p.out, 0xff, expected.size() * sizeof(float)));
    CUDA_OK(cuda::LaunchLazyDecodeAttention(separate, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    const auto out_separate = ToHost(p.out, expected.size());
    const auto k_separate = bits(ToHost(d.k_pool, pool)), v_separate = bits(ToHost(d.v_pool, pool));
    restore_pools();
    cuda::DecodeAttentionParams fused = p;
    fused.q = nullptr;  // read from the QKV rows
    fused.new_tokens = {
        .qkv = kw.qkv, .slot_blocks = kw.slot_blocks, .slot_index = kw.slot_index, .rope_positions = kw.rope_positions};
    CUDA_OK(cudaMemset(p.out, 0xff, expected.size() * sizeof(float)));
    CUDA_OK(cuda::LaunchLazyDecodeAttention(fused, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    const auto out_fused = ToHost(p.out, expected.size());
    EXPECT_TRUE(bits(ToHost(d.k_pool, pool)) == k_separate) << "keys written differ from the KV write kernel's";
    EXPECT_TRUE(bits(ToHost(d.v_pool, pool)) == v_separate) << "values written differ from the KV write kernel's";
    EXPECT_EQ(0, std::memcmp(out_fused.data(), out_separate.data(), out_fused.size() * sizeof(float)))
        << "the fused KV write's output differs, splits " << splits;
    EXPECT_NE(0, std::memcmp(out_fused.data(), got.data(), got.size() * sizeof(float)))
        << "the fresh keys and values did not reach the output";
    restore_pools();  // the materialize check below reads the problem's pools
  }

  // Materialize: the first sequence's chunk blocks re-rotated into fresh blocks.
  std::vector<int32_t> src, dst, counts, copy_deltas;
  for (const KvBlockRef& ref : problem.tables[0]) {
    if (ref.delta == 0) continue;
    src.push_back(ref.block);
    dst.push_back(ref.block);  // in place is fine for the check below
    counts.push_back(ref.num_tokens);
    copy_deltas.push_back(ref.delta);
  }
  const cpu::RopeTable table(TestRope(s.style), s.head_dim);
  const cpu::KvLayerView kv = problem.kv_view();
  for (size_t i = 0; i < src.size(); ++i)
    cpu::CopyBlockRotated(kv, src[i], src[i], 0, counts[i], copy_deltas[i], table);
  cuda::MaterializeParams m;
  m.kv = problem.PoolKv(d);
  m.src_blocks = arena.Copy(src);
  m.dst_blocks = arena.Copy(dst);
  m.num_tokens = arena.Copy(counts);
  m.deltas = arena.Copy(copy_deltas);
  m.num_copies = static_cast<int>(src.size());
  CUDA_OK(cuda::LaunchMaterialize(m, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  const auto k_gpu = ToHost(d.k_pool, problem.k_bf.size());
  std::vector<float> k_gpu_fp(k_gpu.size());
  for (size_t i = 0; i < k_gpu.size(); ++i) k_gpu_fp[i] = __bfloat162float(k_gpu[i]);
  EXPECT_LT(RelativeError(k_gpu_fp, problem.k_fp), 8e-3);  // one bf16 rounding after the rotation
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, DecodeAttentionGpuTest,
    ::testing::Values(Shape{128, 32, 8, 16, 1, 8, 512, RopeStyle::kRotateHalf, 131072},        // Llama-3-8B, batch 1
                      Shape{128, 32, 8, 16, 5, 3, 300, RopeStyle::kRotateHalf, 4000},          // a batch, odd lengths
                      Shape{64, 8, 4, 16, 3, 4, 77, RopeStyle::kInterleaved, 100000},          // llama2.c style
                      Shape{64, 8, 8, 7, 2, 12, 40, RopeStyle::kInterleaved, 500},             // odd block size, MHA
                      Shape{128, 8, 1, 32, 1, 30, 600, RopeStyle::kRotateHalf, 131072},        // group of 8, long
                      Shape{128, 12, 4, 16, 4, 5, 200, RopeStyle::kRotateHalf, 131072},        // group of 3
                      Shape{128, 8, 4, 7, 3, 10, 50, RopeStyle::kInterleaved, 131072},         // group of 2, odd blocks
                      Shape{128, 16, 16, 16, 2, 3, 100, RopeStyle::kInterleaved, 1000, 3},     // MHA, 3 splits
                      Shape{64, 16, 2, 32, 3, 6, 90, RopeStyle::kRotateHalf, 50000, 5},        // hd 64 group of 8
                      Shape{128, 32, 8, 16, 40, 4, 512, RopeStyle::kRotateHalf, 131072},       // batch 40
                      Shape{128, 32, 8, 16, 1, 16, 512, RopeStyle::kRotateHalf, 131072, 100},  // many splits
                      Shape{128, 3, 1, 16, 1, 6, 200, RopeStyle::kRotateHalf, 5000, 5}),       // odd partial count
    [](const ::testing::TestParamInfo<Shape>& info) {
      const Shape& s = info.param;
      return "hd" + std::to_string(s.head_dim) + "_group" + std::to_string(s.n_heads / s.n_kv_heads) + "_block" +
             std::to_string(s.block_size) + "_batch" + std::to_string(s.num_seqs) + "_chunks" +
             std::to_string(s.chunks) + (s.splits > 0 ? "_splits" + std::to_string(s.splits) : "");
    });

}  // namespace
}  // namespace lazykv::testing
