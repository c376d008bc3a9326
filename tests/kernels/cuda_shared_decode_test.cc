// Chunk-shared decode attention (kernels/cuda/shared_decode_attention.h) against the per-sequence
// kernel (LaunchLazyDecodeAttention) and the CPU twin (cpu::LazyPagedAttention) on the same
// inputs: random batches whose sequences draw documents from a small set (Zipf-like), each use at
// its own delta, with documents used twice by one sequence, private documents (used once),
// sequences with no document, partly filled blocks, and some queries that do not see their whole
// table. Skips without a GPU.
//
// Tolerances (RelativeError: max abs difference over a sequence's rows / max abs reference),
// per variant (SharedKernelVariantTolerance): both kernels read the same bf16 K/V and accumulate
// in fp32. The default rounds the rotated query and the probabilities once to bf16 for the
// tensor cores (as the prefill kernel does): within one bf16 step of the largest output
// (measured up to 6.4e-3), two steps allowed (1.6e-2; the reasoning is beside the variants in
// shared_decode_attention.cu). The exact variant, the same kernel but for the rounding, feeds
// them as bf16 hi + lo pairs (about 2^-16 relative each): ~1e-5 expected, 1e-4 allowed, which a
// single bf16 rounding anywhere (~1e-3) would fail, so it holds the kernel's structure to the
// per-sequence kernel tightly. Against the CPU twin 2e-3 (the per-sequence kernel's own test
// tolerance) plus the variant's.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>

#include "gtest/gtest.h"
#include "kernels/cuda/lazy_decode_attention.h"
#include "kernels/cuda/shared_decode_attention.h"
#include "kernels/cuda/shared_decode_plan.h"
#include "tests/kernels/cuda_paged_problem.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/test_util.h"

namespace lazykv::testing {
namespace {

struct Shape {
  int head_dim, n_heads, n_kv_heads, block_size, num_seqs;
  int num_docs, max_doc_tokens, max_uses, max_own_tokens;
  RopeStyle style;
  int max_members = 0, max_entries = 0;  // planner caps; 0: SharedDecodeOptionsFor's
};

// Builds the batch directly in a PagedProblem: document blocks are allocated once and referenced
// by every use, each use at its own delta.
void BuildBatch(const Shape& s, std::mt19937_64& rng, PagedProblem& problem) {
  struct Doc {
    std::vector<std::pair<int32_t, int32_t>> blocks;  // (block, tokens)
  };
  auto make_doc = [&](int tokens) {
    Doc d;
    for (int done = 0; done < tokens; done += s.block_size) {
      d.blocks.push_back({problem.num_blocks++, std::min(s.block_size, tokens - done)});
    }
    return d;
  };
  std::vector<Doc> docs;
  std::vector<double> weights;
  for (int d = 0; d < s.num_docs; ++d) {
    docs.push_back(make_doc(std::uniform_int_distribution<int>(1, s.max_doc_tokens)(rng)));
    weights.push_back(1.0 / std::pow(d + 1.0, 1.1));
  }
  std::discrete_distribution<int> pick(weights.begin(), weights.end());
  for (int seq = 0; seq < s.num_seqs; ++seq) {
    problem.tables.emplace_back();
    int32_t length = 0;
    auto add = [&](int32_t block, int32_t tokens, int32_t delta) {
      problem.block_ids.push_back(block);
      problem.block_tokens.push_back(tokens);
      problem.block_deltas.push_back(delta);
      problem.block_starts.push_back(length);
      problem.tables.back().push_back(KvBlockRef{block, tokens, delta});
      length += tokens;
    };
    const int uses = seq % 7 == 3 ? 0 : std::uniform_int_distribution<int>(0, s.max_uses)(rng);
    for (int u = 0; u < uses; ++u) {
      const bool private_doc = std::uniform_int_distribution<int>(0, 4)(rng) == 0;
      const Doc doc =
          private_doc ? make_doc(std::uniform_int_distribution<int>(1, s.max_doc_tokens)(rng)) : docs[pick(rng)];
      const int32_t delta = std::uniform_int_distribution<int32_t>(0, 131072)(rng);
      for (const auto& [block, tokens] : doc.blocks) add(block, tokens, delta);
    }
    const Doc own = make_doc(std::uniform_int_distribution<int>(1, s.max_own_tokens)(rng));
    for (const auto& [block, tokens] : own.blocks) add(block, tokens, 0);
    const bool hidden = std::uniform_int_distribution<int>(0, 7)(rng) == 0;
    problem.table_offsets.push_back(static_cast<int32_t>(problem.block_ids.size()));
    problem.query_offsets.push_back(problem.query_offsets.back() + 1);
    problem.query_pos0.push_back(hidden ? std::uniform_int_distribution<int32_t>(0, length - 1)(rng) : length - 1);
    problem.max_queries = 1;
    problem.max_entries = std::max<int>(problem.max_entries, problem.tables.back().size());
  }
}

class SharedDecodeGpuTest : public ::testing::TestWithParam<Shape> {};

TEST_P(SharedDecodeGpuTest, MatchesPerSequenceKernelAndCpu) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  const Shape s = GetParam();
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);

  // The batch and its plan (on the host); a batch that happens to share nothing is drawn again.
  PagedProblem problem(s.n_heads, s.n_kv_heads, s.head_dim, s.block_size, s.style);
  cuda::SharedDecodePlan plan;
  cuda::SharedDecodePlanOptions options = cuda::SharedDecodeOptionsFor(s.n_heads, s.n_kv_heads, s.block_size);
  if (s.max_members > 0) options.max_members = s.max_members;
  if (s.max_entries > 0) options.max_entries_per_item = s.max_entries;
  options.solo_items = false;  // the plan without solo items decides whether the batch shares
  for (int attempt = 0; attempt < 20 && plan.items.empty(); ++attempt) {
    problem = PagedProblem(s.n_heads, s.n_kv_heads, s.head_dim, s.block_size, s.style);
    BuildBatch(s, rng, problem);
    const cuda::SharedDecodeTables tables{
        problem.block_ids.data(),    problem.block_tokens.data(),  problem.block_deltas.data(),
        problem.block_starts.data(), problem.table_offsets.data(), problem.query_pos0.data(),
        problem.num_seqs()};
    plan = cuda::PlanSharedDecode(tables, options);
  }
  ASSERT_GT(plan.items.size(), 0u) << "no batch shared anything: the shared kernel would go untested";
  problem.Draw(rng);
  const std::vector<float> expected = problem.Reference();

  // The per-sequence kernel.
  DeviceArena arena;
  const DevicePagedProblem d = problem.Upload(arena);
  cuda::DecodeAttentionParams base = problem.DecodeParams(d);
  base.workspace = arena.Alloc<float>(cuda::DecodeWorkspaceBytes(base, cuda::ChooseDecodeSplits(base)) / 4 + 1);
  CUDA_OK(cudaMemset(base.out, 0xff, expected.size() * sizeof(float)));
  CUDA_OK(cuda::LaunchLazyDecodeAttention(base, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  const std::vector<float> per_seq = ToHost(base.out, expected.size());

  // The shared path, with and without solo items, every kernel variant (0 is the default), each
  // on a poisoned workspace and output (NaN) so that an unwritten element that is read fails.
  const cuda::SharedDecodeTables tables{
      problem.block_ids.data(),    problem.block_tokens.data(),  problem.block_deltas.data(),
      problem.block_starts.data(), problem.table_offsets.data(), problem.query_pos0.data(),
      problem.num_seqs()};
  for (const bool solo : {false, true}) {
    options.solo_items = solo;
    const cuda::SharedDecodePlan run_plan = solo ? cuda::PlanSharedDecode(tables, options) : plan;
    cuda::SharedDecodeParams p;
    p.base = base;
    p.base.out = arena.Alloc<float>(expected.size());
    p.items = arena.Copy(run_plan.items);
    p.members = arena.Copy(run_plan.members);
    p.shared_parts = arena.Copy(run_plan.shared_parts);
    p.num_items = static_cast<int>(run_plan.items.size());
    p.max_shared_parts = run_plan.max_shared_parts;
    p.res_block_ids = arena.Copy(run_plan.res_block_ids);
    p.res_block_tokens = arena.Copy(run_plan.res_block_tokens);
    p.res_block_deltas = arena.Copy(run_plan.res_block_deltas);
    p.res_block_starts = arena.Copy(run_plan.res_block_starts);
    p.res_offsets = arena.Copy(run_plan.res_offsets);
    p.max_residual_entries = run_plan.max_residual_entries;
    const size_t ws_bytes = cuda::SharedDecodeWorkspaceBytes(p);
    p.workspace = arena.Alloc<float>(ws_bytes / 4 + 1);

    for (int variant = 0; variant < cuda::kSharedKernelVariants; ++variant) {
      SCOPED_TRACE(::testing::Message() << (solo ? "solo items, " : "") << "kernel variant " << variant << ": "
                                        << cuda::SharedKernelVariantName(variant));
      p.kernel_variant = variant;
      CUDA_OK(cudaMemset(p.workspace, 0xff, ws_bytes));
      CUDA_OK(cudaMemset(p.base.out, 0xff, expected.size() * sizeof(float)));
      CUDA_OK(cuda::LaunchSharedDecodeAttention(p, nullptr));
      CUDA_OK(cudaDeviceSynchronize());
      const std::vector<float> shared = ToHost(p.base.out, expected.size());

      double worst_kernel = 0.0, worst_cpu = 0.0, worst_base_cpu = 0.0;
      for (int seq = 0; seq < problem.num_seqs(); ++seq) {
        const double vs_kernel = RelativeError(problem.Rows(shared, seq), problem.Rows(per_seq, seq));
        const double vs_cpu = RelativeError(problem.Rows(shared, seq), problem.Rows(expected, seq));
        worst_kernel = std::max(worst_kernel, vs_kernel);
        worst_cpu = std::max(worst_cpu, vs_cpu);
        worst_base_cpu =
            std::max(worst_base_cpu, RelativeError(problem.Rows(per_seq, seq), problem.Rows(expected, seq)));
        EXPECT_LT(vs_kernel, cuda::SharedKernelVariantTolerance(variant))
            << "sequence " << seq << " of " << problem.num_seqs() << " vs the per-sequence kernel";
        EXPECT_LT(vs_cpu, 2e-3 + cuda::SharedKernelVariantTolerance(variant))
            << "sequence " << seq << " vs the CPU twin";
      }
      // The residual kernel beside the shared one, on a second stream: the same partials in
      // the same places, so the same output bit for bit.
      {
        cudaStream_t side = nullptr;
        cudaEvent_t fork = nullptr, join = nullptr;
        CUDA_OK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
        CUDA_OK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
        CUDA_OK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
        cuda::SharedDecodeParams beside = p;
        beside.residual_stream = side;
        beside.fork = fork;
        beside.join = join;
        CUDA_OK(cudaMemset(p.workspace, 0xff, ws_bytes));
        CUDA_OK(cudaMemset(p.base.out, 0xff, expected.size() * sizeof(float)));
        CUDA_OK(cuda::LaunchSharedDecodeAttention(beside, nullptr));
        CUDA_OK(cudaDeviceSynchronize());
        const std::vector<float> two_streams = ToHost(p.base.out, expected.size());
        EXPECT_EQ(0, std::memcmp(two_streams.data(), shared.data(), shared.size() * sizeof(float)))
            << "the residual kernel on a second stream changed the output";
        cudaEventDestroy(fork);
        cudaEventDestroy(join);
        cudaStreamDestroy(side);
      }
      std::printf(
          "shared decode (%svariant %d): %d seqs, %zu items (%d solo), %zu members, %d runs, residual max %d "
          "entries; worst relative error %.2e vs per-sequence kernel, %.2e vs CPU (per-sequence kernel vs CPU "
          "%.2e)\n",
          solo ? "solo, " : "", variant, problem.num_seqs(), run_plan.items.size(), run_plan.num_solo_items,
          run_plan.members.size(), run_plan.num_runs, run_plan.max_residual_entries, worst_kernel, worst_cpu,
          worst_base_cpu);
    }
    // 40 residual splits (most of them empty): every pair merges more than 32 states, so the
    // combine crosses its batches of 16 and its rounds of 32 weights, and skips empty states.
    if (run_plan.max_residual_entries > 0) {
      SCOPED_TRACE(::testing::Message() << (solo ? "solo items, " : "") << "40 residual splits");
      cuda::SharedDecodeParams many = p;
      many.kernel_variant = 0;
      many.residual_splits = 40;
      ASSERT_EQ(40, cuda::SharedResidualSplits(many));
      const size_t many_bytes = cuda::SharedDecodeWorkspaceBytes(many);
      many.workspace = arena.Alloc<float>(many_bytes / 4 + 1);
      CUDA_OK(cudaMemset(many.workspace, 0xff, many_bytes));
      CUDA_OK(cudaMemset(many.base.out, 0xff, expected.size() * sizeof(float)));
      CUDA_OK(cuda::LaunchSharedDecodeAttention(many, nullptr));
      CUDA_OK(cudaDeviceSynchronize());
      const std::vector<float> out = ToHost(many.base.out, expected.size());
      for (int seq = 0; seq < problem.num_seqs(); ++seq) {
        EXPECT_LT(RelativeError(problem.Rows(out, seq), problem.Rows(per_seq, seq)),
                  cuda::SharedKernelVariantTolerance(0))
            << "sequence " << seq << " vs the per-sequence kernel";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, SharedDecodeGpuTest,
    ::testing::Values(
        // hd, heads, kv, block, seqs, docs, doc tokens, uses, own tokens, style[, members, entries]
        Shape{128, 32, 8, 16, 24, 8, 600, 6, 90, RopeStyle::kRotateHalf},         // Llama-3-8B, group 4
        Shape{128, 32, 8, 16, 40, 6, 300, 5, 40, RopeStyle::kRotateHalf, 3, 2},   // small caps: many items
        Shape{64, 8, 8, 16, 12, 5, 200, 4, 50, RopeStyle::kInterleaved},          // MHA, hd 64
        Shape{128, 8, 1, 32, 20, 6, 500, 4, 70, RopeStyle::kRotateHalf},          // group 8, block 32
        Shape{64, 12, 4, 7, 9, 4, 120, 5, 30, RopeStyle::kInterleaved},           // group 3, odd block
        Shape{128, 20, 4, 16, 30, 3, 400, 4, 60, RopeStyle::kRotateHalf},         // group 5: rows cross warps
        Shape{64, 14, 2, 16, 33, 2, 250, 3, 20, RopeStyle::kRotateHalf},          // group 7, member-cap splits
        Shape{128, 16, 8, 16, 1, 2, 300, 6, 40, RopeStyle::kInterleaved},         // one sequence (docs reused)
        Shape{128, 16, 8, 16, 2, 3, 1100, 3, 20, RopeStyle::kRotateHalf, 0, 64},  // long items (64 entries)
        Shape{64, 16, 8, 32, 17, 10, 64, 8, 33, RopeStyle::kInterleaved}),        // many short documents
    [](const ::testing::TestParamInfo<Shape>& info) {
      const Shape& s = info.param;
      return "hd" + std::to_string(s.head_dim) + "_group" + std::to_string(s.n_heads / s.n_kv_heads) + "_block" +
             std::to_string(s.block_size) + "_batch" + std::to_string(s.num_seqs) + "_docs" +
             std::to_string(s.num_docs) + (s.max_members > 0 ? "_members" + std::to_string(s.max_members) : "") +
             (s.max_entries > 0 ? "_entries" + std::to_string(s.max_entries) : "");
    });

}  // namespace
}  // namespace lazykv::testing
