// GPU kernels against the CPU reference, on fresh random inputs at several shapes (odd
// lengths, partly filled blocks, many chunks, deltas up to 128k). Skips without a GPU.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

#include "gtest/gtest.h"
#include "kernels/cpu/paged_attention.h"
#include "kernels/cuda/lazy_decode_attention.h"
#include "kernels/cuda/materialize.h"
#include "tests/cuda_test_util.h"
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
  RopeConfig rope;
  rope.style = s.style;
  rope.theta = s.style == RopeStyle::kInterleaved ? 10000.0 : 500000.0;
  rope.llama3_scaling = s.style == RopeStyle::kRotateHalf;

  // Block tables: per sequence, `chunks` chunks with random deltas (partly filled last
  // blocks), then the sequence's own blocks with delta 0.
  std::vector<int32_t> ids, tokens, deltas, starts, offsets = {0}, positions;
  std::vector<std::vector<KvBlockRef>> tables(s.num_seqs);
  int32_t next_block = 0;
  for (int seq = 0; seq < s.num_seqs; ++seq) {
    int32_t logical = 0;
    for (int c = 0; c <= s.chunks; ++c) {
      const bool own = c == s.chunks;
      const int len = std::uniform_int_distribution<int>(1, s.max_chunk_tokens)(rng);
      const int32_t delta = own ? 0 : std::uniform_int_distribution<int32_t>(0, s.max_delta)(rng);
      for (int done = 0; done < len; done += s.block_size) {
        const int fill = std::min(s.block_size, len - done);
        tables[seq].push_back(KvBlockRef{next_block, fill, delta});
        ids.push_back(next_block++);
        tokens.push_back(fill);
        deltas.push_back(delta);
        starts.push_back(logical);
        logical += fill;
      }
    }
    offsets.push_back(static_cast<int32_t>(ids.size()));
    positions.push_back(logical - 1);
  }
  int max_entries = 0;
  for (const auto& t : tables) max_entries = std::max<int>(max_entries, t.size());

  const size_t pool = static_cast<size_t>(next_block) * s.block_size * s.n_kv_heads * s.head_dim;
  std::vector<__nv_bfloat16> k_bf, v_bf;
  std::vector<float> k_fp, v_fp;
  RandomBf16(rng, pool, k_bf, k_fp);
  RandomBf16(rng, pool, v_bf, v_fp);
  std::normal_distribution<float> dist;
  std::vector<float> q(static_cast<size_t>(s.num_seqs) * s.n_heads * s.head_dim);
  for (float& x : q) x = dist(rng);

  // CPU reference.
  const cpu::RopeTable table(rope, s.head_dim);
  const cpu::KvLayerView kv{k_fp.data(), v_fp.data(), next_block, s.block_size, s.n_kv_heads, s.head_dim};
  std::vector<float> expected(q.size());
  const size_t q_width = static_cast<size_t>(s.n_heads) * s.head_dim;
  for (int seq = 0; seq < s.num_seqs; ++seq) {
    cpu::LazyPagedAttention(q.data() + seq * q_width, &positions[seq], 1, s.n_heads, tables[seq], kv, table,
                            expected.data() + seq * q_width);
  }

  // GPU, output poisoned first so that an unwritten element fails.
  cuda::DecodeAttentionParams p;
  p.q = ToDevice(q);
  p.k_pool = ToDevice(k_bf);
  p.v_pool = ToDevice(v_bf);
  p.block_ids = ToDevice(ids);
  p.block_tokens = ToDevice(tokens);
  p.block_deltas = ToDevice(deltas);
  p.block_starts = ToDevice(starts);
  p.table_offsets = ToDevice(offsets);
  p.positions = ToDevice(positions);
  p.inv_freq = ToDevice(RopeInverseFrequencies(rope, s.head_dim));
  p.num_seqs = s.num_seqs;
  p.n_heads = s.n_heads;
  p.n_kv_heads = s.n_kv_heads;
  p.head_dim = s.head_dim;
  p.block_size = s.block_size;
  p.rope_style = s.style == RopeStyle::kInterleaved ? 0 : 1;
  p.max_entries_per_seq = max_entries;
  p.num_splits = s.splits;
  const int splits = cuda::ChooseDecodeSplits(p);
  CUDA_OK(cudaMalloc(&p.workspace, cuda::DecodeWorkspaceBytes(p, splits)));
  CUDA_OK(cudaMalloc(&p.out, q.size() * sizeof(float)));
  CUDA_OK(cudaMemset(p.out, 0xff, q.size() * sizeof(float)));  // NaN
  CUDA_OK(cuda::LaunchLazyDecodeAttention(p, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  const auto got = ToHost(p.out, q.size());
  double worst = 0.0;
  for (int seq = 0; seq < s.num_seqs; ++seq) {
    const std::vector<float> g(got.begin() + seq * q_width, got.begin() + (seq + 1) * q_width);
    const std::vector<float> e(expected.begin() + seq * q_width, expected.begin() + (seq + 1) * q_width);
    const double error = RelativeError(g, e);
    worst = std::max(worst, error);
    EXPECT_LT(error, 2e-3) << "sequence " << seq << " of " << s.num_seqs << ", splits " << splits;
  }
  std::printf("decode: worst relative error %.2e over %d sequences, %d splits\n", worst, s.num_seqs, splits);

  // Materialize: the first sequence's chunk blocks re-rotated into fresh blocks.
  std::vector<int32_t> src, dst, counts, copy_deltas;
  for (const KvBlockRef& ref : tables[0]) {
    if (ref.delta == 0) continue;
    src.push_back(ref.block);
    dst.push_back(ref.block);  // in place is fine for the check below
    counts.push_back(ref.num_tokens);
    copy_deltas.push_back(ref.delta);
  }
  std::vector<float> k_rotated = k_fp;
  for (size_t i = 0; i < src.size(); ++i) cpu::CopyBlockRotated(kv, src[i], src[i], counts[i], copy_deltas[i], table);
  cuda::MaterializeParams m;
  m.k_pool = const_cast<void*>(p.k_pool);
  m.v_pool = const_cast<void*>(p.v_pool);
  m.src_blocks = ToDevice(src);
  m.dst_blocks = ToDevice(dst);
  m.num_tokens = ToDevice(counts);
  m.deltas = ToDevice(copy_deltas);
  m.inv_freq = p.inv_freq;
  m.num_copies = static_cast<int>(src.size());
  m.n_kv_heads = s.n_kv_heads;
  m.head_dim = s.head_dim;
  m.block_size = s.block_size;
  m.rope_style = p.rope_style;
  CUDA_OK(cuda::LaunchMaterialize(m, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  const auto k_gpu = ToHost(static_cast<const __nv_bfloat16*>(p.k_pool), pool);
  std::vector<float> k_gpu_fp(pool);
  for (size_t i = 0; i < pool; ++i) k_gpu_fp[i] = __bfloat162float(k_gpu[i]);
  EXPECT_LT(RelativeError(k_gpu_fp, k_fp), 8e-3);  // one bf16 rounding after the rotation
  for (void* ptr : {(void*)p.q, (void*)p.k_pool, (void*)p.v_pool, (void*)p.block_ids, (void*)p.block_tokens,
                    (void*)p.block_deltas, (void*)p.block_starts, (void*)p.table_offsets, (void*)p.positions,
                    (void*)p.inv_freq, (void*)p.workspace, (void*)p.out, (void*)m.src_blocks, (void*)m.dst_blocks,
                    (void*)m.num_tokens, (void*)m.deltas}) {
    cudaFree(ptr);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, DecodeAttentionGpuTest,
    ::testing::Values(Shape{128, 32, 8, 16, 1, 8, 512, RopeStyle::kRotateHalf, 131072},   // Llama-3-8B, batch 1
                      Shape{128, 32, 8, 16, 5, 3, 300, RopeStyle::kRotateHalf, 4000},     // a batch, odd lengths
                      Shape{64, 8, 4, 16, 3, 4, 77, RopeStyle::kInterleaved, 100000},     // llama2.c style
                      Shape{64, 8, 8, 7, 2, 12, 40, RopeStyle::kInterleaved, 500},        // odd block size, MHA
                      Shape{128, 8, 1, 32, 1, 30, 600, RopeStyle::kRotateHalf, 131072},   // group of 8, long
                      Shape{128, 12, 4, 16, 4, 5, 200, RopeStyle::kRotateHalf, 131072},   // group of 3
                      Shape{128, 8, 4, 7, 3, 10, 50, RopeStyle::kInterleaved, 131072},    // group of 2, odd blocks
                      Shape{128, 16, 16, 16, 2, 3, 100, RopeStyle::kInterleaved, 1000, 3},  // MHA, 3 splits
                      Shape{64, 16, 2, 32, 3, 6, 90, RopeStyle::kRotateHalf, 50000, 5},   // hd 64 group of 8
                      Shape{128, 32, 8, 16, 40, 4, 512, RopeStyle::kRotateHalf, 131072}),  // batch 40
    [](const ::testing::TestParamInfo<Shape>& info) {
      const Shape& s = info.param;
      return "hd" + std::to_string(s.head_dim) + "_group" + std::to_string(s.n_heads / s.n_kv_heads) + "_block" +
             std::to_string(s.block_size) + "_batch" + std::to_string(s.num_seqs) + "_chunks" +
             std::to_string(s.chunks) + (s.splits > 0 ? "_splits" + std::to_string(s.splits) : "");
    });

}  // namespace
}  // namespace lazykv::testing
