// The lazy prefill attention kernel against the CPU reference (LazyPagedAttention), on
// fresh random inputs at several shapes: odd query counts, partly filled blocks (at the
// end of every chunk and of the request), many chunks with deltas up to 128k, both RoPE
// styles, head dims 64 and 128, GQA groups 1, 4 and 8, block sizes 16 to 256, chunked
// prefill (pos0 > 0) and whole-sequence prefill, and keys whose scores jump mid-row (the
// running maximum moved far: O rescaled). Every launch runs again with its output wanted in
// bf16 too (out_bf16), which must be the fp32 output's rounding bit for bit. The GPU tests
// skip without a GPU; the shape validation (of the prefill and the decode launchers) runs
// everywhere (it returns before any CUDA call).
//
// Tolerance: the kernel feeds the tensor cores bf16 operands (the rotated query, the
// keys, the softmax probabilities, the values); keys and values are bf16 on both sides,
// so the difference comes from rounding the rotated query and the probabilities to bf16
// (relative 2^-9 = 2e-3 each) with fp32 accumulation. We allow 1e-2 of the output's
// largest magnitude (max |gpu - cpu| / max |cpu|, per sequence; 2e-2 where the keys are
// scaled up: own_keys_dominate), about 5x the expected rounding; a wrong rotation, mask or
// index gives errors of order 1.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/bf16.h"
#include "kernels/cuda/lazy_decode_attention.h"
#include "kernels/cuda/lazy_prefill_attention.h"
#include "tests/kernels/cuda_paged_problem.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/test_util.h"

namespace lazykv::testing {
namespace {

struct PrefillShape {
  std::string name;
  int head_dim, n_heads, n_kv_heads, block_size, num_seqs;
  int chunks, max_chunk_tokens;  // documents before the request's own tokens
  int max_prior_own;             // own tokens already cached before the query run (chunked prefill)
  int max_queries;               // new query tokens per sequence
  bool queries_from_start;       // every token of the sequence is a query (pos0 = 0)
  bool first_chunk_delta_zero;   // the first chunk shares delta 0 with what precedes it
  RopeStyle style;
  int max_delta;
  bool default_is_persistent = false;  // the default launch must take the persistent kernel
  // Keys of each sequence's own tokens scaled by this (a power of two: exact in bf16), from its
  // own block own_scaled_from on, so that a row's maximum score jumps past the documents' far
  // enough for the kernels to rescale a running O that is not zero (their kept maxima hold while
  // a half tile's exponentials sum to at most 2^12 a thread). The scores' error from the bf16
  // query grows with the keys, so such a shape gets `tolerance` to match.
  float own_key_scale = 1.0f;
  double tolerance = 1e-2;
  int own_scaled_from = 0;
  int min_queries = 1;  // new query tokens per sequence: min_queries .. max_queries
  // Half the entries moved to random pool blocks (PagedProblem::ScatterBlocks): tiles of full
  // blocks that are not at consecutive pool slots (copied by cp.async, not TMA) beside ones that are.
  bool scatter_blocks = false;
};

// How many graph nodes (kernels) a launch on 1 CTA enqueues, counted in a graph captured from it
// (not run); 0 where the capture failed.
size_t CapturedKernels(const cuda::PrefillAttentionParams& p, int schedule) {
  cudaStream_t stream;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) return 0;
  cudaGraph_t graph = nullptr;
  size_t nodes = 0;
  if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess) {
    const cudaError_t launched = cuda::detail::LaunchLazyPrefillAttentionVariant(p, schedule, stream, 1);
    if (cudaStreamEndCapture(stream, &graph) == cudaSuccess && launched == cudaSuccess) {
      cudaGraphGetNodes(graph, nullptr, &nodes);
    }
    if (graph != nullptr) cudaGraphDestroy(graph);
  }
  cudaStreamDestroy(stream);
  return nodes;
}

class PrefillAttentionGpuTest : public ::testing::TestWithParam<PrefillShape> {};

TEST_P(PrefillAttentionGpuTest, MatchesCpuReference) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  const PrefillShape s = GetParam();
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);

  // Per sequence: chunks at random deltas, then the own tokens (delta 0): `prior` already
  // cached, then the query run, whose keys the caller has written before attention.
  PagedProblem problem(s.n_heads, s.n_kv_heads, s.head_dim, s.block_size, s.style);
  std::vector<std::pair<int, int>> own_blocks;  // per sequence: its own tokens' blocks [first, end)
  auto rand_int = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int seq = 0; seq < s.num_seqs; ++seq) {
    for (int c = 0; c < s.chunks; ++c) {
      const int32_t delta = c == 0 && s.first_chunk_delta_zero ? 0 : rand_int(1, s.max_delta);
      problem.AddSegment(rand_int(1, s.max_chunk_tokens), delta);
    }
    int n_queries = rand_int(s.min_queries, s.max_queries);
    if (seq == 0 && n_queries > 1) n_queries |= 1;  // an odd count
    const int prior = s.max_prior_own > 0 ? rand_int(0, s.max_prior_own) : 0;
    own_blocks.emplace_back(problem.num_blocks, 0);
    problem.AddSegment(prior + n_queries, 0);
    own_blocks.back().second = problem.num_blocks;
    if (s.queries_from_start) n_queries = problem.length();
    problem.EndSequence(n_queries);
  }
  if (s.scatter_blocks) problem.ScatterBlocks(rng);
  problem.Draw(rng);
  if (s.own_key_scale != 1.0f) {
    for (const auto& [first, end] : own_blocks) problem.ScaleKeys(first + s.own_scaled_from, end, s.own_key_scale);
  }
  const std::vector<float> expected = problem.Reference();

  // GPU, output poisoned first so that an unwritten element fails.
  DeviceArena arena;
  cuda::PrefillAttentionParams p = problem.PrefillParams(problem.Upload(arena));
  float* out = p.out;
  const std::vector<int32_t>& q_offsets = problem.query_offsets;
  const std::vector<int32_t>& pos0 = problem.query_pos0;
  // As the launcher chooses (split-KV where the launch is small; heads packed into a tile
  // where queries are few) and unsplit, with the default schedule of the kernel's main loop;
  // the default schedule never packed, packed as far as it can (even for long query runs)
  // split as chosen and in three splits, and two heads a tile where the group allows; each
  // schedule unsplit and in three splits.
  int most_pack = 1;
  while (most_pack * 2 <= cuda::MaxPrefillPack(s.head_dim) && (s.n_heads / s.n_kv_heads) % (most_pack * 2) == 0) {
    most_pack *= 2;
  }
  struct Run {
    int forced_splits, schedule, pack_heads, max_ctas;
    bool work_starts = false;  // the launch's work starts, made by it (PrefillWorkStartsBytes)
    bool q_rotated = false;    // q comes rotated at its positions (PrefillAttentionParams::q_rotated)
  };
  std::vector<Run> runs = {{0, -1, 0, 0}, {1, -1, 0, 0}, {0, -1, 1, 0}, {0, -1, most_pack, 0}, {3, -1, most_pack, 0}};
  if (most_pack > 2) runs.push_back({0, -1, 2, 0});
  // (Three splits: the two-warpgroup kernel's split range, which the default launch never takes.)
  for (int schedule = 0; schedule < cuda::detail::kNumPrefillSchedules; ++schedule) {
    runs.push_back({1, schedule, 0, 0});
    runs.push_back({3, schedule, 0, 0});
  }
  // The persistent schedule on a grid far smaller than its work tiles: each CTA walks many,
  // packed and not, split (where some splits see no key: empty work tiles) and not.
  // With work starts too (a CTA's next work tile and its first tiles read, not walked), and
  // the default launch with them (persistent where the shape makes it so).
  for (const int ctas : {1, 3}) {
    runs.push_back({1, cuda::detail::kPersistentSchedule, 0, ctas});
    runs.push_back({3, cuda::detail::kPersistentSchedule, most_pack, ctas});
    runs.push_back({1, cuda::detail::kPersistentSchedule, 0, ctas, true});
    runs.push_back({1, cuda::detail::kPersistentSchedule, most_pack, ctas, true});
  }
  runs.push_back({1, cuda::detail::kPersistentSchedule, 0, 0, true});
  runs.push_back({0, -1, 0, 0, true});
  runs.push_back({3, cuda::detail::kSpecializedSchedule, most_pack, 0, true});  // the one-tile kernel's starts, split
  // q rotated at its positions before the kernel, as the backend's KV write leaves it: the default
  // launch (split and packed as chosen), every schedule unsplit and in three splits, and the
  // persistent kernel on 3 CTAs packed and not, with starts.
  runs.push_back({0, -1, 0, 0, true, true});
  runs.push_back({3, -1, most_pack, 0, false, true});
  for (int schedule = 0; schedule < cuda::detail::kNumPrefillSchedules; ++schedule) {
    runs.push_back({1, schedule, 0, 0, false, true});
    runs.push_back({3, schedule, 0, 0, false, true});
  }
  runs.push_back({1, cuda::detail::kPersistentSchedule, 0, 3, true, true});
  runs.push_back({1, cuda::detail::kPersistentSchedule, most_pack, 3, true, true});
  // R(position) q on the host (the CPU reference's rotation), uploaded beside the raw rows.
  std::vector<float> rotated_q = problem.q;
  {
    const cpu::RopeTable table(TestRope(s.style), s.head_dim);
    for (int seq = 0; seq < problem.num_seqs(); ++seq) {
      for (int i = q_offsets[seq]; i < q_offsets[seq + 1]; ++i) {
        table.RotateHeads(rotated_q.data() + i * problem.q_width(), s.n_heads, pos0[seq] + (i - q_offsets[seq]));
      }
    }
  }
  const float* raw_q = p.q;
  const float* rotated_q_device = arena.Copy(rotated_q);
  // A second launch's output: allocated poisoned with NaN (an element left unwritten fails), then
  // every sequence's rows checked against the reference and the buffer freed.
  const auto new_poisoned_output = [&](float** d) {
    CUDA_OK(cudaMalloc(d, expected.size() * sizeof(float)));
    CUDA_OK(cudaMemset(*d, 0xff, expected.size() * sizeof(float)));
  };
  const auto expect_rows_match = [&](float* d, const char* what) {
    const std::vector<float> rows = ToHost(d, expected.size());
    cudaFree(d);
    for (int seq = 0; seq < s.num_seqs; ++seq) {
      EXPECT_LT(RelativeError(problem.Rows(rows, seq), problem.Rows(expected, seq)), s.tolerance)
          << "sequence " << seq << ": " << what;
    }
  };
  for (const auto& [forced_splits, schedule, pack_heads, max_ctas, work_starts, q_rotated] : runs) {
    p.num_splits = forced_splits;
    p.pack_heads = pack_heads;
    p.q_rotated = q_rotated;
    p.q = q_rotated ? rotated_q_device : raw_q;
    if (s.default_is_persistent && schedule < 0 && forced_splits <= 1 && pack_heads <= 1) {
      int sms = 0;
      CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
      EXPECT_EQ(cuda::detail::ChoosePrefillSchedule(p, sms), cuda::detail::kPersistentSchedule)
          << "the shape is meant to run the default launch's persistent kernel";
      EXPECT_TRUE(cuda::PrefillTakesPersistentKernel(p)) << "the persistent kernel gains from a rotated query";
    }
    const int splits = cuda::ChoosePrefillSplits(p);
    const int pack = schedule < 0 || pack_heads > 1 ? cuda::ChoosePrefillPack(p) : 1;
    if (pack_heads == 0 && schedule < 0) {  // the choice: packed exactly when queries are few
      EXPECT_EQ(pack, p.max_queries_per_seq <= 64 ? most_pack : 1) << p.max_queries_per_seq << " queries";
    }
    const size_t ws_bytes = cuda::PrefillWorkspaceBytes(p, splits);
    p.workspace = nullptr;
    if (ws_bytes > 0) {
      CUDA_OK(cudaMalloc(&p.workspace, ws_bytes));
    }
    p.work_starts = nullptr;
    if (const size_t bytes = cuda::PrefillWorkStartsBytes(p); work_starts && bytes > 0) {
      CUDA_OK(cudaMalloc(&p.work_starts, bytes));
      CUDA_OK(cudaMemset(p.work_starts, 0xff, bytes));  // a start read before it is written: wrong rows or a hang
    }
    CUDA_OK(cudaMemset(out, 0xff, expected.size() * sizeof(float)));  // NaN: an unwritten element fails
    CUDA_OK(schedule < 0 ? cuda::LaunchLazyPrefillAttention(p, nullptr)
                         : cuda::detail::LaunchLazyPrefillAttentionVariant(p, schedule, nullptr, max_ctas));
    // The backend's reuse of one starts buffer by launches back to back (every layer): a second
    // launch on 1 CTA, whose starts differ (each CTA's next work tile), rewrites the buffer while
    // the first may still run; both must come out right.
    float* out_again = nullptr;
    float* out_made = nullptr;
    const bool reuse = work_starts && schedule == cuda::detail::kPersistentSchedule && max_ctas == 3;
    if (reuse) {
      new_poisoned_output(&out_again);
      cuda::PrefillAttentionParams again = p;
      again.out = out_again;
      CUDA_OK(cuda::detail::LaunchLazyPrefillAttentionVariant(again, schedule, nullptr, 1));
      // A third launch of the same shape (1 CTA) on the starts the second made, as a step's
      // later layers run: one kernel (counted in a captured graph), the same rows.
      new_poisoned_output(&out_made);
      cuda::PrefillAttentionParams made = again;
      made.out = out_made;
      made.work_starts_made = true;
      CUDA_OK(cuda::detail::LaunchLazyPrefillAttentionVariant(made, schedule, nullptr, 1));
      const size_t with_starts_kernel = CapturedKernels(again, schedule), reusing = CapturedKernels(made, schedule);
      EXPECT_GE(reusing, 1u);
      EXPECT_EQ(with_starts_kernel, reusing + 1) << "a launch on starts made before runs no starts kernel";
    }
    // The one-tile kernel on starts an earlier launch made, as a step's later layers run it: it
    // reads them before it waits for the kernel before it, so the launch that made them has
    // completed first (the synchronization). The same rows, and one kernel fewer in the launch.
    float* out_one_tile = nullptr;
    const bool one_tile_reuse = work_starts && schedule < 0 && !cuda::PrefillTakesPersistentKernel(p);
    if (one_tile_reuse) {
      new_poisoned_output(&out_one_tile);
      CUDA_OK(cudaDeviceSynchronize());
      cuda::PrefillAttentionParams made = p;
      made.out = out_one_tile;
      made.work_starts_made = true;
      CUDA_OK(cuda::LaunchLazyPrefillAttention(made, nullptr));
      const size_t making = CapturedKernels(p, cuda::detail::kSpecializedSchedule);
      const size_t reading = CapturedKernels(made, cuda::detail::kSpecializedSchedule);
      EXPECT_GE(reading, 1u);
      EXPECT_EQ(making, reading + 1) << "the one-tile launch makes its starts, or reads those made before";
    }
    CUDA_OK(cudaDeviceSynchronize());
    const auto got = ToHost(out, expected.size());
    // The same launch with its output wanted in bf16 too (out_bf16; out is then scratch, poisoned
    // again): the fp32 output rounded to nearest even bit for bit, every row written (the
    // unsplit persistent kernel writes only the bf16 rows, through shared memory, the unsplit
    // one-tile kernel straight from its registers; the others are converted after them).
    // The rows sit between two guard bands of a whole tile's rows (128 x width each), which
    // must come out untouched: a box or a row stored off its place fails.
    const size_t guard = 128 * static_cast<size_t>(problem.q_width());
    std::vector<uint16_t> got_bf16(expected.size() + 2 * guard);
    {
      uint16_t* out_bf16 = nullptr;
      CUDA_OK(cudaMalloc(&out_bf16, got_bf16.size() * sizeof(uint16_t)));
      CUDA_OK(cudaMemset(out_bf16, 0xff, got_bf16.size() * sizeof(uint16_t)));  // NaN
      CUDA_OK(cudaMemset(out, 0xff, expected.size() * sizeof(float)));
      cuda::PrefillAttentionParams with_bf16 = p;
      with_bf16.out_bf16 = out_bf16 + guard;
      CUDA_OK(schedule < 0 ? cuda::LaunchLazyPrefillAttention(with_bf16, nullptr)
                           : cuda::detail::LaunchLazyPrefillAttentionVariant(with_bf16, schedule, nullptr, max_ctas));
      CUDA_OK(cudaDeviceSynchronize());
      CUDA_OK(cudaMemcpy(got_bf16.data(), out_bf16, got_bf16.size() * sizeof(uint16_t), cudaMemcpyDeviceToHost));
      // Which launches write the bf16 rows themselves (the one-tile and the persistent kernels,
      // unsplit): no conversion kernel after them, in a graph captured from the launch (1 CTA).
      const int chosen = schedule >= 0                                   ? schedule
                         : cuda::PrefillTakesPersistentKernel(with_bf16) ? cuda::detail::kPersistentSchedule
                                                                         : cuda::detail::kSpecializedSchedule;
      const size_t fp32_kernels = CapturedKernels(p, chosen), bf16_kernels = CapturedKernels(with_bf16, chosen);
      EXPECT_GT(fp32_kernels, 0u);
      EXPECT_LE(bf16_kernels, fp32_kernels + 1) << "at most one conversion after the kernel";
      if (schedule < 0) {
        EXPECT_EQ(cuda::PrefillWritesBf16(with_bf16), bf16_kernels == fp32_kernels) << "the backend's question";
      } else if (forced_splits == 1 &&
                 (schedule == cuda::detail::kSpecializedSchedule || schedule == cuda::detail::kPersistentSchedule)) {
        EXPECT_EQ(bf16_kernels, fp32_kernels) << "schedule " << schedule << " unsplit writes bf16 itself";
      }
      cudaFree(out_bf16);
    }
    size_t bf16_mismatches = 0, guards_written = 0;
    for (size_t i = 0; i < got.size(); ++i) bf16_mismatches += got_bf16[guard + i] != cpu::FloatToBf16Bits(got[i]);
    for (size_t i = 0; i < guard; ++i) {
      guards_written += (got_bf16[i] != 0xffff) + (got_bf16[guard + got.size() + i] != 0xffff);
    }
    EXPECT_EQ(guards_written, 0u) << "bf16 outputs written outside the rows";
    EXPECT_EQ(bf16_mismatches, 0u) << "of " << got.size() << " bf16 outputs differ from the fp32 output's rounding; "
                                   << "schedule " << schedule << ", splits " << forced_splits << ", heads per tile "
                                   << pack_heads << " on " << max_ctas << " CTAs";
    if (reuse) {
      expect_rows_match(out_again, "the second launch on the same work starts");
      expect_rows_match(out_made, "a launch on work starts made by an earlier launch");
    }
    if (one_tile_reuse) expect_rows_match(out_one_tile, "the one-tile kernel on work starts made by an earlier launch");
    cudaFree(p.workspace);
    cudaFree(p.work_starts);
    p.work_starts = nullptr;
    for (int seq = 0; seq < s.num_seqs; ++seq) {
      const std::vector<float> g = problem.Rows(got, seq), e = problem.Rows(expected, seq);
      const size_t unwritten = std::count_if(g.begin(), g.end(), [](float x) { return !std::isfinite(x); });
      EXPECT_EQ(unwritten, 0u) << "sequence " << seq << ", splits " << splits << ": non-finite outputs";
      const double error = RelativeError(g, e);
      EXPECT_LT(error, s.tolerance) << "sequence " << seq << " of " << s.num_seqs << ", splits " << splits
                                    << ", schedule " << schedule << (work_starts ? " with work starts" : "")
                                    << (q_rotated ? ", q rotated before" : "") << " on " << max_ctas
                                    << " CTAs (0: as launched), heads per tile " << pack << ", "
                                    << (q_offsets[seq + 1] - q_offsets[seq]) << " queries from position " << pos0[seq];
      std::printf(
          "[          ] %s seq %d, splits %d, schedule %d, heads per tile %d: %d queries from %d, %zu entries, rel "
          "error %.2e\n",
          s.name.c_str(), seq, splits, schedule, pack, q_offsets[seq + 1] - q_offsets[seq], pos0[seq],
          problem.tables[seq].size(), error);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, PrefillAttentionGpuTest,
    ::testing::Values(
        // Llama-3-8B attention, RAG request: 8 documents, then a chunked-prefill query run.
        PrefillShape{"llama3_rag", 128, 32, 8, 16, 2, 8, 512, 40, 300, false, false, RopeStyle::kRotateHalf, 131072},
        // llama2.c style, MHA, the first chunk at delta 0 behind a partly filled block.
        PrefillShape{"llama2c_mha", 64, 8, 8, 16, 3, 4, 77, 20, 200, false, true, RopeStyle::kInterleaved, 100000},
        // Group of 8, many chunks, blocks of 32.
        PrefillShape{"group8_long", 128, 8, 1, 32, 1, 30, 600, 100, 257, false, false, RopeStyle::kRotateHalf, 131072},
        // Blocks of 128: a KV tile is part of a block.
        PrefillShape{"group8_block128", 64, 16, 2, 128, 2, 5, 300, 200, 300, false, false, RopeStyle::kInterleaved,
                     50000},
        // Blocks of 256, rotate-half at head dim 64.
        PrefillShape{"gqa4_block256", 64, 32, 8, 256, 1, 6, 400, 300, 150, false, true, RopeStyle::kRotateHalf, 131072},
        // Ordinary causal prefill of a whole sequence (no chunks, pos0 = 0).
        PrefillShape{"causal_only", 128, 32, 8, 16, 1, 0, 1, 0, 1000, false, false, RopeStyle::kRotateHalf, 0},
        // Every token a query, chunks included: query tiles see delta changes mid-tile.
        PrefillShape{"all_tokens_queries", 128, 16, 4, 64, 2, 3, 200, 10, 100, true, false, RopeStyle::kInterleaved,
                     131072},
        // Short questions over cached documents (heads packed into a tile by default): Llama-3-8B,
        // 8 documents, up to 16 question tokens.
        PrefillShape{"llama3_question", 128, 32, 8, 16, 5, 8, 512, 0, 16, false, false, RopeStyle::kRotateHalf, 131072},
        // A group of 8 at head dim 64 (8 heads a tile, up to 40 queries: several tiles a head group).
        PrefillShape{"group8_question_hd64", 64, 16, 2, 16, 3, 3, 300, 40, 40, false, false, RopeStyle::kInterleaved,
                     100000},
        // A group of 8 at head dim 128: two tiles of 4 heads each per KV head.
        PrefillShape{"group8_question_hd128", 128, 16, 2, 32, 2, 2, 400, 0, 30, false, false, RopeStyle::kRotateHalf,
                     131072},
        // A group of 2, blocks of 128.
        PrefillShape{"group2_question_block128", 128, 8, 4, 128, 2, 4, 200, 10, 64, false, true,
                     RopeStyle::kInterleaved, 50000},
        // A question over a long table (48 documents, about 1500 entries): the split's entry
        // range is found by a 32-way search, three rounds past 1024 entries.
        PrefillShape{"many_entries_question", 128, 32, 8, 16, 2, 48, 1000, 30, 16, false, false, RopeStyle::kRotateHalf,
                     131072},
        // Short sequences whose every token is a query: packed tiles see delta changes mid-tile.
        PrefillShape{"short_all_tokens_queries", 128, 32, 8, 16, 4, 2, 20, 0, 20, true, false, RopeStyle::kRotateHalf,
                     131072},
        // Many short sequences, every token a query (at most 512 keys a query, over 2 work tiles
        // an SM): the default launch takes the persistent kernel, its workspace as the launcher sized it.
        PrefillShape{"many_short_sequences", 128, 32, 8, 16, 12, 2, 128, 0, 256, true, false, RopeStyle::kRotateHalf,
                     131072, true},
        // The own tokens' keys 4x the documents': a query row's maximum jumps (by about 2^12 in
        // exp2 units for the later rows) when its tiles reach them, after tiles whose maxima were
        // kept; the own tokens start a KV tile (a tile never spans two deltas), so the jump comes
        // in a tile's first half. Scores 4x larger: twice the usual tolerance (the kernel before
        // the kept maxima erred by 1.5e-2 with keys 8x).
        PrefillShape{"own_keys_dominate", 128, 16, 4, 16, 2, 4, 512, 100, 300, false, false, RopeStyle::kRotateHalf,
                     131072, false, 4.0f, 2e-2},
        // The same jump in the second half of a KV tile, after a first half whose maxima were
        // kept: the own tokens' keys scaled from their block 4 on, keys 64-127 of the own run's
        // first tile (blocks of 16; at least 128 queries, so every sequence has them), so the
        // kernels rescale O between the two halves' P V (lazy_prefill_math.cuh,
        // SoftmaxAndIssueValues).
        PrefillShape{"own_keys_jump_mid_tile", 128, 16, 4, 16, 2, 3, 300, 100, 300, false, false,
                     RopeStyle::kRotateHalf, 131072, false, 4.0f, 2e-2, 4, 128},
        // Llama-3-8B, documents of up to 512 tokens (up to four whole tiles), the table's blocks half
        // scattered over the pool: tiles read by TMA boxes and by cp.async in one launch.
        PrefillShape{"llama3_scattered_blocks", 128,    32,    8,    16,   2, 6, 512, 40, 300, false, false,
                     RopeStyle::kRotateHalf,    131072, false, 1.0f, 1e-2, 0, 1, true}),
    [](const ::testing::TestParamInfo<PrefillShape>& info) { return info.param.name; });

// Unsupported shapes come back as cudaErrorInvalidValue before any CUDA call (no GPU needed),
// from the prefill and the decode launchers alike: `good` changed by `mutate`.
template <typename Params, typename Launch, typename Mutate>
void ExpectInvalid(const Params& good, Launch launch, Mutate mutate, const char* what) {
  Params p = good;
  mutate(p);
  EXPECT_EQ(launch(p), cudaErrorInvalidValue) << what;
}

// Llama-3-8B's attention shape, with nothing to do.
cuda::PrefillAttentionParams GoodShape() {
  cuda::PrefillAttentionParams good;
  good.num_seqs = 1;
  good.n_heads = 32;
  good.kv.n_kv_heads = 8;
  good.kv.head_dim = 128;
  good.kv.block_size = 16;
  good.kv.rope_style = cuda::RopeStyle::kRotateHalf;
  good.max_queries_per_seq = 0;  // succeeds without touching the device
  return good;
}

TEST(PrefillAttentionShapes, RejectsUnsupported) {
  const cuda::PrefillAttentionParams good = GoodShape();
  EXPECT_EQ(cuda::LaunchLazyPrefillAttention(good, nullptr), cudaSuccess);
  const auto launch = [](const cuda::PrefillAttentionParams& p) {
    return cuda::LaunchLazyPrefillAttention(p, nullptr);
  };
  const auto expect_invalid = [&](auto mutate, const char* what) { ExpectInvalid(good, launch, mutate, what); };
  expect_invalid([](auto& p) { p.kv.head_dim = 96; }, "head dim 96");
  expect_invalid([](auto& p) { p.kv.block_size = 24; }, "block size 24");
  expect_invalid([](auto& p) { p.kv.block_size = 8; }, "block size 8");
  expect_invalid([](auto& p) { p.kv.n_kv_heads = 6; }, "32 heads over 6 KV heads");
  expect_invalid([](auto& p) { p.kv.rope_style = static_cast<cuda::RopeStyle>(2); }, "rope style 2");
  expect_invalid([](auto& p) { p.kv.element = cuda::Element::kFp32; }, "fp32 pool");
  expect_invalid([](auto& p) { p.num_seqs = 0; }, "no sequences");
  expect_invalid([](auto& p) { p.num_splits = -1; }, "negative splits");
  expect_invalid([](auto& p) { p.max_queries_per_seq = 5; }, "null pointers");
  expect_invalid([](auto& p) { p.pack_heads = 3; }, "3 heads a tile");
  expect_invalid([](auto& p) { p.pack_heads = 8; }, "8 heads a tile (a group of 4)");
  expect_invalid([](auto& p) { p.pack_heads = -1; }, "negative heads a tile");
  const auto variant = [](const cuda::PrefillAttentionParams& p) {
    return cuda::detail::LaunchLazyPrefillAttentionVariant(p, 0, nullptr);
  };
  ExpectInvalid(
      good, variant, [](auto& p) { p.pack_heads = 2; }, "a packed tile in a schedule that never packs");
  EXPECT_EQ(variant(good), cudaSuccess);
  // A bf16 output that the launch cannot write: refused after the pointers are checked, before any
  // kernel (the pointers are never dereferenced).
  cuda::PrefillAttentionParams with_rows = good;
  with_rows.max_queries_per_seq = 5;
  with_rows.total_queries = 5;
  const auto fake = [](uintptr_t at) { return reinterpret_cast<int32_t*>(at); };
  with_rows.q = reinterpret_cast<const float*>(uintptr_t{1} << 20);
  with_rows.kv.k_pool = with_rows.kv.v_pool = reinterpret_cast<void*>(uintptr_t{2} << 20);
  with_rows.kv.block_ids = with_rows.kv.block_tokens = with_rows.kv.block_deltas = with_rows.kv.block_starts =
      with_rows.kv.table_offsets = fake(uintptr_t{3} << 20);
  with_rows.query_offsets = with_rows.query_pos0 = fake(uintptr_t{4} << 20);
  with_rows.kv.inv_freq = reinterpret_cast<const double*>(uintptr_t{5} << 20);
  with_rows.out = reinterpret_cast<float*>(uintptr_t{6} << 20);
  ExpectInvalid(
      with_rows, variant, [](auto& p) { p.out_bf16 = reinterpret_cast<void*>((uintptr_t{7} << 20) + 8); },
      "a bf16 output not 16-byte aligned");
  ExpectInvalid(
      with_rows, variant,
      [](auto& p) {
        p.out_bf16 = reinterpret_cast<void*>(uintptr_t{7} << 20);
        p.total_queries = 0;
      },
      "a bf16 output of unknown rows");
  ExpectInvalid(
      with_rows, variant, [](auto& p) { p.out_bf16 = reinterpret_cast<char*>(p.out) + 64; },
      "a bf16 output over the fp32 one");
}

// The heads a tile packs (host code, no GPU needed): as many of a KV group as the rotation
// warpgroup allows when a sequence has at most 64 queries, one otherwise, or what was asked.
TEST(PrefillAttentionShapes, ChoosesHeadsPerTile) {
  cuda::PrefillAttentionParams p = GoodShape();  // 32 heads over 8: groups of 4, head dim 128
  const auto pack = [&](int queries) {
    p.max_queries_per_seq = queries;
    return cuda::ChoosePrefillPack(p);
  };
  EXPECT_EQ(pack(1), 4);
  EXPECT_EQ(pack(16), 4);
  EXPECT_EQ(pack(64), 4);
  EXPECT_EQ(pack(65), 1);  // an unpacked tile would be more than half full
  EXPECT_EQ(pack(4096), 1);
  p.kv.n_kv_heads = 4;  // groups of 8: at head dim 128 the rotation steps 4 rows at a time
  EXPECT_EQ(pack(16), 4);
  p.kv.head_dim = 64;  // 8 rows a step at head dim 64
  EXPECT_EQ(pack(16), 8);
  p.n_heads = 24;  // groups of 6: the largest power of two that divides them
  EXPECT_EQ(pack(16), 2);
  p.n_heads = 4;  // one head a group
  EXPECT_EQ(pack(16), 1);
  p = GoodShape();
  p.pack_heads = 2;  // asked for, and allowed: taken for any query count
  EXPECT_EQ(pack(4096), 2);
  p.pack_heads = 1;
  EXPECT_EQ(pack(16), 1);
  p.pack_heads = 3;  // not a power of two: refused (0)
  EXPECT_EQ(pack(16), 0);
}

// The default launch's schedule (host code, no GPU needed): persistent exactly when every query
// sees at most kPersistentMaxKeys keys (a known hint) or the launch wants a bf16 output and its
// queries are at least a quarter of its keys (at most kLongPrefillMaxKeys), and the launch is unsplit with at least two
// work tiles an SM, counted in packed tiles; and the work starts' size.
TEST(PrefillAttentionShapes, ChoosesPersistentForShortKeyLoops) {
  constexpr int kSms = 132;
  constexpr int kPersistent = cuda::detail::kPersistentSchedule;
  cuda::PrefillAttentionParams p = GoodShape();  // 32 heads over 8, head dim 128
  p.num_seqs = 16;
  p.max_queries_per_seq = 1024;  // 32 heads x 8 query tiles x 16 = 4096 work tiles
  p.max_keys = 1024;
  // The persistent kernel reads its query rows through a tensor map: q aligned, its rows known
  // (a pointer never dereferenced here).
  p.q = reinterpret_cast<const float*>(uintptr_t{1} << 20);
  p.total_queries = 16 * 1024;
  EXPECT_EQ(cuda::detail::ChoosePrefillSchedule(p, kSms), kPersistent);
  p.total_queries = 0;  // not known
  EXPECT_NE(cuda::detail::ChoosePrefillSchedule(p, kSms), kPersistent);
  p.total_queries = 16 * 1024;
  p.q = reinterpret_cast<const float*>((uintptr_t{1} << 20) + 4);  // not 16-byte aligned
  EXPECT_NE(cuda::detail::ChoosePrefillSchedule(p, kSms), kPersistent);
  p.q = reinterpret_cast<const float*>(uintptr_t{1} << 20);
  EXPECT_EQ(cuda::detail::ChoosePrefillSchedule(p, kSms), kPersistent);
  p.max_keys = cuda::detail::kPersistentMaxKeys;
  EXPECT_EQ(cuda::detail::ChoosePrefillSchedule(p, kSms), kPersistent);
  p.max_keys = cuda::detail::kPersistentMaxKeys + 1;  // long KV loops: one work tile a CTA
  EXPECT_NE(cuda::detail::ChoosePrefillSchedule(p, kSms), kPersistent);
  // ... unless the output is wanted in bf16 (a pointer never dereferenced here) and the KV loops
  // are a long prefill's rows (queries at least a quarter of the keys), up to kLongPrefillMaxKeys.
  p.out_bf16 = reinterpret_cast<void*>(uintptr_t{1} << 24);
  EXPECT_EQ(cuda::detail::ChoosePrefillSchedule(p, kSms), kPersistent);
  p.max_queries_per_seq = 256;  // under a quarter of the keys
  EXPECT_NE(cuda::detail::ChoosePrefillSchedule(p, kSms), kPersistent);
  p.max_queries_per_seq = 1024;
  p.max_keys = 4096;  // exactly a quarter
  EXPECT_EQ(cuda::detail::ChoosePrefillSchedule(p, kSms), kPersistent);
  p.max_keys = 4097;
  EXPECT_NE(cuda::detail::ChoosePrefillSchedule(p, kSms), kPersistent);
  p.max_queries_per_seq = cuda::detail::kLongPrefillMaxKeys;
  p.max_keys = cuda::detail::kLongPrefillMaxKeys;
  EXPECT_EQ(cuda::detail::ChoosePrefillSchedule(p, kSms), kPersistent);
  p.max_queries_per_seq = cuda::detail::kLongPrefillMaxKeys + 1;  // past it the one-tile kernel, bf16 too
  p.max_keys = cuda::detail::kLongPrefillMaxKeys + 1;
  EXPECT_NE(cuda::detail::ChoosePrefillSchedule(p, kSms), kPersistent);
  p.max_queries_per_seq = 512;  // the last 512 queries of 2k
  p.max_keys = 2048;
  EXPECT_EQ(cuda::detail::ChoosePrefillSchedule(p, kSms), kPersistent);
  p.max_keys = 4112;  // a document's rows beside questions over 4k cached keys
  EXPECT_NE(cuda::detail::ChoosePrefillSchedule(p, kSms), kPersistent);
  EXPECT_EQ(cuda::detail::ChoosePrefillSchedule(p, kSms, /*max_keys=*/1 << 20), kPersistent);  // the bound moved
  p.max_queries_per_seq = 1024;
  p.out_bf16 = nullptr;
  p.max_keys = 0;  // not known
  EXPECT_NE(cuda::detail::ChoosePrefillSchedule(p, kSms), kPersistent);
  p.max_keys = 1024;
  p.num_splits = 3;  // split keys: a launch under one wave
  EXPECT_NE(cuda::detail::ChoosePrefillSchedule(p, kSms), kPersistent);
  p.num_splits = 0;
  p.num_seqs = 1;  // 256 work tiles, under two an SM
  EXPECT_NE(cuda::detail::ChoosePrefillSchedule(p, kSms), kPersistent);
  p.num_seqs = 2;  // 512
  EXPECT_EQ(cuda::detail::ChoosePrefillSchedule(p, kSms), kPersistent);
  // Short questions pack 4 heads a tile: 8 head groups x 1 tile x seqs.
  p.max_queries_per_seq = 16;
  p.num_seqs = 33;  // 264 = 2 x 132
  EXPECT_EQ(cuda::detail::ChoosePrefillSchedule(p, kSms), kPersistent);
  p.num_seqs = 32;  // 256 packed tiles (1024 had each head its own tile)
  EXPECT_NE(cuda::detail::ChoosePrefillSchedule(p, kSms), kPersistent);
  // The work starts: one record a work tile (unsplit, heads packed as the persistent kernel
  // packs them), or a one-tile CTA where the default launch splits into more.
  p.max_queries_per_seq = 2048;
  p.num_seqs = 8;  // 32 heads x 16 query tiles x 8 = 4096 work tiles
  ASSERT_EQ(cuda::ChoosePrefillSplits(p), 1);
  const size_t per_tile = cuda::PrefillWorkStartsBytes(p) / 4096;
  EXPECT_GT(per_tile, 0u);
  EXPECT_EQ(cuda::PrefillWorkStartsBytes(p), 4096 * per_tile);
  p.max_queries_per_seq = 16;  // 4 heads a tile: 8 head groups x 1 tile x 8 sequences
  p.num_splits = 1;
  EXPECT_EQ(cuda::PrefillWorkStartsBytes(p), 64 * per_tile);
  p.num_splits = 3;  // the one-tile kernel's CTAs, three a work tile
  EXPECT_EQ(cuda::PrefillWorkStartsBytes(p), 3 * 64 * per_tile);
}

TEST(DecodeAttentionShapes, RejectsUnsupported) {
  const cuda::DecodeAttentionParams good = cuda::DecodeParamsFrom(GoodShape(), nullptr, 0);
  const auto launch = [](const cuda::DecodeAttentionParams& p) { return cuda::LaunchLazyDecodeAttention(p, nullptr); };
  const auto expect_invalid = [&](auto mutate, const char* what) { ExpectInvalid(good, launch, mutate, what); };
  expect_invalid([](auto& p) { p.kv.head_dim = 96; }, "head dim 96");
  expect_invalid([](auto& p) { p.kv.n_kv_heads = 6; }, "32 heads over 6 KV heads");
  expect_invalid([](auto& p) { p.kv.n_kv_heads = 2; }, "a group of 16");
  expect_invalid([](auto& p) { p.kv.element = cuda::Element::kFp32; }, "fp32 pool");
  expect_invalid([](auto& p) { p.num_seqs = 0; }, "no sequences");
}

}  // namespace
}  // namespace lazykv::testing
