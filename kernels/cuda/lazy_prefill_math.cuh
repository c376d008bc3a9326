// The lazy prefill kernels' per-tile math on Hopper's warpgroup MMA (kernels/cuda/wgmma.cuh):
// S = Q K^T with both operands in shared memory, the masked online softmax that leaves P in
// registers, and O += P V with V read transposed. Included only by the prefill kernels.
#pragma once

#include <cfloat>
#include <cstdint>

#include "kernels/cuda/lazy_prefill_tiles.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace lazykv::cuda {
namespace {

// S = Q K^T for the warpgroup's 64 rows and the tile's 128 keys (issued, not waited for).
// A k16 step moves 32 bytes along a 128-byte swizzled row, or to the next 64-column
// block: only the descriptors' start-address field (bytes / 16, low bits) changes.
template <int HD>
__device__ __forceinline__ void IssueScores(float (&s)[kBN / 2], uint32_t q_rows, uint32_t k_stage) {
  const uint64_t a0 = wgmma::Descriptor(q_rows, 16, 1024);
  const uint64_t b0 = wgmma::Descriptor(k_stage, 16, 1024);
  wgmma::Fence();
#pragma unroll
  for (int ks = 0; ks < HD / 16; ++ks) {
    const uint32_t col = (ks % 4) * 32;  // k16 step within a 128-byte swizzled row
    wgmma::WgmmaSS_N128(s, a0 + (((ks / 4) * (kBM * 128) + col) >> 4), b0 + (((ks / 4) * (kBN * 128) + col) >> 4),
                        ks > 0 ? 1 : 0);
  }
  wgmma::Commit();
}

// O += P V for the key steps [first, first + kSteps) (keys 16 first .. 16 (first + kSteps)
// - 1): P (64 rows x those keys) from registers, V read transposed. Issued and committed, not
// waited for; the accumulators of an earlier, unfinished group may be the same (wgmma orders
// accumulation into the same registers).
template <int HD, int kSteps = kBN / 16>
__device__ __forceinline__ void IssueValues(float (&o)[HD / 2], const uint32_t (&pa)[kBN / 16][4], uint32_t v_stage,
                                            int first = 0) {
  const uint64_t b0 = wgmma::Descriptor(v_stage, kBN * 128, 1024);
  wgmma::Fence();
#pragma unroll
  for (int kt = first; kt < first + kSteps; ++kt) {
    const uint64_t b = b0 + ((kt * 16 * 128) >> 4);
    if constexpr (HD == 128) {
      wgmma::WgmmaRS_N128(o, pa[kt], b);
    } else {
      wgmma::WgmmaRS_N64(o, pa[kt], b);
    }
  }
  wgmma::Commit();
}

// The online softmax of one tile in steps (mask, row maxima, rescale, exponentials over a range
// of keys), so that a caller can issue the first keys' P V before the last keys' exponentials
// (SoftmaxTile runs them all in order). Score element i of s: row my_row0 + 8 ((i / 2) % 2),
// column (i / 4) 8 + 2 t4 + i % 2 (the m64nNk16 accumulator layout). Base 2, the 1/sqrt(d)
// scale folded into scale_log2.

// Step 1: masks the scores of keys past each row's position (cp: the tile's key positions).
__device__ __forceinline__ void MaskScores(float (&s)[kBN / 2], const int* cp, bool needs_mask,
                                           const int (&row_pos)[2]) {
  if (!needs_mask) return;
  const int t4 = threadIdx.x % 4;
#pragma unroll
  for (int n = 0; n < kBN / 8; ++n) {
    const int2 c2 = *reinterpret_cast<const int2*>(cp + n * 8 + 2 * t4);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (c2.x > row_pos[h]) s[n * 4 + 2 * h] = -INFINITY;
      if (c2.y > row_pos[h]) s[n * 4 + 2 * h + 1] = -INFINITY;
    }
  }
}

// Step 2: each row's maximum over the tile, mx[h] (rows my_row0 and my_row0 + 8; the four
// threads of a row reduced by shuffles).
__device__ __forceinline__ void RowMaxima(const float (&s)[kBN / 2], float (&mx)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float x = -INFINITY;
#pragma unroll
    for (int n = 0; n < kBN / 8; ++n) x = fmaxf(x, fmaxf(s[n * 4 + 2 * h], s[n * 4 + 2 * h + 1]));
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    mx[h] = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
  }
}

// Step 2': the running maxima m moved to max(m, mx); l and O rescaled to them; mb[h] =
// m_use * scale_log2, the offset of step 3's exponentials (0 for a row with nothing
// visible yet).
template <int HD>
__device__ __forceinline__ void RescaleToMax(const float (&mx)[2], float (&o)[HD / 2], float (&m)[2], float (&l)[2],
                                             float (&mb)[2], float scale_log2) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float m_new = fmaxf(m[h], mx[h]);
    const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // a row with nothing visible yet
    const float corr = exp2f((m[h] - m_use) * scale_log2);
    m[h] = m_new;
    mb[h] = m_use * scale_log2;
    l[h] *= corr;
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) {
      o[n * 4 + 2 * h] *= corr;
      o[n * 4 + 2 * h + 1] *= corr;
    }
  }
}

// Step 3, for the key steps [first, first + kSteps): P = 2^(s scale_log2 - mb), its row sums
// added to sum, and P left as bf16 in the A-operand layout of m64nNk16 (per warp the m16n8
// accumulator layout is the m16k16 operand layout): pa[kt] holds keys 16 kt .. 16 kt + 15.
// s is not changed. first must be known once the caller's loops are unrolled (registers are
// not indexed).
template <int kSteps>
__device__ __forceinline__ void ExpScores(int first, const float (&s)[kBN / 2], const float (&mb)[2], float scale_log2,
                                          float (&sum)[2], uint32_t (&pa)[kBN / 16][4]) {
  float add[2] = {0.0f, 0.0f};
#pragma unroll
  for (int kt = first; kt < first + kSteps; ++kt) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {  // elements 2 r and 2 r + 1: row r % 2
      const float e0 = exp2f(fmaf(s[8 * kt + 2 * r], scale_log2, -mb[r % 2]));
      const float e1 = exp2f(fmaf(s[8 * kt + 2 * r + 1], scale_log2, -mb[r % 2]));
      add[r % 2] += e0 + e1;
      pa[kt][r] = PackBf16(e0, e1);
    }
  }
  sum[0] += add[0];
  sum[1] += add[1];
}

// All the steps in order: the tile's scores folded into the running softmax (max m, sum l;
// O rescaled), P left in pa.
template <int HD>
__device__ __forceinline__ void SoftmaxTile(float (&s)[kBN / 2], float (&o)[HD / 2], float (&m)[2], float (&l)[2],
                                            uint32_t (&pa)[kBN / 16][4], const int* cp, bool needs_mask,
                                            const int (&row_pos)[2], float scale_log2) {
  MaskScores(s, cp, needs_mask, row_pos);
  float mx[2], mb[2];
  RowMaxima(s, mx);
  RescaleToMax<HD>(mx, o, m, l, mb, scale_log2);
  ExpScores<kBN / 16>(0, s, mb, scale_log2, l, pa);
}

// A tile's softmax and O += P V in two halves of the keys: the first half's P V goes to the
// tensor cores as soon as its exponentials are made and runs while the second half's are (the
// consumer then waits only for the products). Four pieces measured no faster than two
// (bench/results/prefill_split_pv_2026-11-28.md).
// The running maxima are kept while the tile's exponentials against them stay small
// (FlashAttention-4's conditional rescaling): O then needs no rescale, and the common tile
// needs no row maxima at all. A half is kept where every thread's partial row sums of its
// exponentials are at most kKeptSum (so each P is too, which bf16 and the fp32 sums and O hold
// as precisely as P <= 1); the sums are made anyway, so the check costs two compares and a
// vote, where taking the row maxima cost 64 FMNMX and four shuffles a tile
// (bench/results/prefill_softmax_2026-11-29.md). Where a half is not kept, in some row of
// the warp:
//  - the first: the tile's row maxima, the rescale, and the first half made again (a row that
//    has seen no key yet always lands here: its exponentials are made against +inf);
//  - the second (rare: its scores pass the kept maxima by about 2^12 where the first half's
//    did not): O (with the first half's P V, which every tile waits for before this check)
//    and l (with the first half's sum) are rescaled to the tile's maxima and the second half
//    is made again. The own_keys_jump_mid_tile shape of cuda_prefill_test lands there.
// O / l and the (m, l) a split writes stay exact either way, since l counts from the same m as O.
// wait_values() is called once, before the first P V: it must make the values' tile v_stage
// readable by wgmma. Leaves the P V issued and committed, not waited for.
template <int HD, typename WaitValues>
__device__ __forceinline__ void SoftmaxAndIssueValues(float (&s)[kBN / 2], float (&o)[HD / 2], float (&m)[2],
                                                      float (&l)[2], const int* cp, bool needs_mask,
                                                      const int (&row_pos)[2], float scale_log2, uint32_t v_stage,
                                                      WaitValues wait_values) {
  constexpr int kHalf = kBN / 32;  // key steps of 16 in half a tile
  constexpr float kKeptSum = 4096.0f;
  uint32_t pa[kBN / 16][4];
  float mb[2], mx[2], sum[2] = {0.0f, 0.0f};
  const auto kept = [&] {  // NaN and +inf (a row with no key yet) compare false
    return __all_sync(0xffffffffu, sum[0] <= kKeptSum && sum[1] <= kKeptSum);
  };
  MaskScores(s, cp, needs_mask, row_pos);
#pragma unroll
  for (int h = 0; h < 2; ++h) mb[h] = m[h] * scale_log2;  // -inf: every exponential +inf or NaN
  ExpScores<kHalf>(0, s, mb, scale_log2, sum, pa);        // against the kept maxima
  if (!kept()) {
    RowMaxima(s, mx);
    RescaleToMax<HD>(mx, o, m, l, mb, scale_log2);
    sum[0] = sum[1] = 0.0f;
    ExpScores<kHalf>(0, s, mb, scale_log2, sum, pa);
  }
  wait_values();
  IssueValues<HD, kHalf>(o, pa, v_stage, 0);
  l[0] += sum[0];
  l[1] += sum[1];
  sum[0] = sum[1] = 0.0f;
  ExpScores<kHalf>(kHalf, s, mb, scale_log2, sum, pa);
  // The first half's P V must be in O before O may be rescaled. The wait is outside the branch:
  // wgmma.wait_group must be executed by the whole warpgroup alike, and kept() is a warp's vote.
  // (A vote across the warpgroup by bar.red, with the wait inside the branch, measured the same.)
  wgmma::Wait<0>();
  wgmma::PinRegisters(o);
  if (!kept()) {
    RowMaxima(s, mx);
    RescaleToMax<HD>(mx, o, m, l, mb, scale_log2);
    sum[0] = sum[1] = 0.0f;
    ExpScores<kHalf>(kHalf, s, mb, scale_log2, sum, pa);
  }
  IssueValues<HD, kHalf>(o, pa, v_stage, kHalf);
  l[0] += sum[0];
  l[1] += sum[1];
}

}  // namespace
}  // namespace lazykv::cuda
