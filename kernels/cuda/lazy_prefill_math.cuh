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

// The online softmax of one tile in three steps, so that a caller can issue the first
// keys' P V before the last keys' exponentials (SoftmaxTile runs all three). Score element i
// of s: row my_row0 + 8 ((i / 2) % 2), column (i / 4) 8 + 2 t4 + i % 2 (the m64nNk16
// accumulator layout). Base 2, the 1/sqrt(d) scale folded into scale_log2.

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

// Step 2: the rows' new maxima m; l and O rescaled to them; mb[h] = m_use * scale_log2, the
// offset of step 3's exponentials (0 for a row with nothing visible yet).
template <int HD>
__device__ __forceinline__ void RescaleToTileMax(const float (&s)[kBN / 2], float (&o)[HD / 2], float (&m)[2],
                                                 float (&l)[2], float (&mb)[2], float scale_log2) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float mx = -INFINITY;
#pragma unroll
    for (int n = 0; n < kBN / 8; ++n) mx = fmaxf(mx, fmaxf(s[n * 4 + 2 * h], s[n * 4 + 2 * h + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m[h], mx);
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

// Step 3, for the key steps [first, first + kSteps): P = 2^(s scale_log2 - mb) added to the
// row sums l and left as bf16 in the A-operand layout of m64nNk16 (per warp the m16n8
// accumulator layout is the m16k16 operand layout): pa[kt] holds keys 16 kt .. 16 kt + 15.
// first must be known once the caller's loops are unrolled (registers are not indexed).
template <int kSteps>
__device__ __forceinline__ void ExpScores(int first, float (&s)[kBN / 2], const float (&mb)[2], float scale_log2,
                                          float (&l)[2], uint32_t (&pa)[kBN / 16][4]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float sum = 0.0f;
#pragma unroll
    for (int n = 2 * first; n < 2 * (first + kSteps); ++n) {
      s[n * 4 + 2 * h] = exp2f(fmaf(s[n * 4 + 2 * h], scale_log2, -mb[h]));
      s[n * 4 + 2 * h + 1] = exp2f(fmaf(s[n * 4 + 2 * h + 1], scale_log2, -mb[h]));
      sum += s[n * 4 + 2 * h] + s[n * 4 + 2 * h + 1];
    }
    l[h] += sum;
  }
#pragma unroll
  for (int kt = first; kt < first + kSteps; ++kt) {
    pa[kt][0] = PackBf16(s[8 * kt + 0], s[8 * kt + 1]);
    pa[kt][1] = PackBf16(s[8 * kt + 2], s[8 * kt + 3]);
    pa[kt][2] = PackBf16(s[8 * kt + 4], s[8 * kt + 5]);
    pa[kt][3] = PackBf16(s[8 * kt + 6], s[8 * kt + 7]);
  }
}

// The three steps at once: the tile's scores folded into the running softmax (max m, sum l;
// O rescaled), P left in pa.
template <int HD>
__device__ __forceinline__ void SoftmaxTile(float (&s)[kBN / 2], float (&o)[HD / 2], float (&m)[2], float (&l)[2],
                                            uint32_t (&pa)[kBN / 16][4], const int* cp, bool needs_mask,
                                            const int (&row_pos)[2], float scale_log2) {
  MaskScores(s, cp, needs_mask, row_pos);
  float mb[2];
  RescaleToTileMax<HD>(s, o, m, l, mb, scale_log2);
  ExpScores<kBN / 16>(0, s, mb, scale_log2, l, pa);
}

// A tile's softmax and O += P V in two halves of the keys: the first half's P V goes to the
// tensor cores as soon as its exponentials are made and runs while the second half's are (the
// consumer then waits only for the products). Four pieces measured no faster than two
// (bench/results/prefill_split_pv_2026-11-28.md). wait_values() is called once, before the
// first P V: it must make the values' tile v_stage readable by wgmma. Leaves the P V issued
// and committed, not waited for.
template <int HD, typename WaitValues>
__device__ __forceinline__ void SoftmaxAndIssueValues(float (&s)[kBN / 2], float (&o)[HD / 2], float (&m)[2],
                                                      float (&l)[2], const int* cp, bool needs_mask,
                                                      const int (&row_pos)[2], float scale_log2, uint32_t v_stage,
                                                      WaitValues wait_values) {
  constexpr int kPieces = 2;
  constexpr int kSteps = kBN / 16 / kPieces;  // key steps of 16 in a piece
  uint32_t pa[kBN / 16][4];
  float mb[2];
  MaskScores(s, cp, needs_mask, row_pos);
  RescaleToTileMax<HD>(s, o, m, l, mb, scale_log2);
  ExpScores<kSteps>(0, s, mb, scale_log2, l, pa);
  wait_values();
  IssueValues<HD, kSteps>(o, pa, v_stage, 0);
#pragma unroll
  for (int piece = 1; piece < kPieces; ++piece) {
    ExpScores<kSteps>(piece * kSteps, s, mb, scale_log2, l, pa);
    IssueValues<HD, kSteps>(o, pa, v_stage, piece * kSteps);
  }
}

}  // namespace
}  // namespace lazykv::cuda
