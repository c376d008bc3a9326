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

// O += P V: P (64 x 128 keys) from registers, V (128 keys x HD) read transposed.
template <int HD>
__device__ __forceinline__ void IssueValues(float (&o)[HD / 2], const uint32_t (&pa)[kBN / 16][4], uint32_t v_stage) {
  const uint64_t b0 = wgmma::Descriptor(v_stage, kBN * 128, 1024);
  wgmma::Fence();
#pragma unroll
  for (int kt = 0; kt < kBN / 16; ++kt) {
    const uint64_t b = b0 + ((kt * 16 * 128) >> 4);
    if constexpr (HD == 128) {
      wgmma::WgmmaRS_N128(o, pa[kt], b);
    } else {
      wgmma::WgmmaRS_N64(o, pa[kt], b);
    }
  }
  wgmma::Commit();
}

// Masks the scores of one tile, folds them into the running softmax (max m, sum l; O
// rescaled) and leaves the probabilities P as bf16 in the A-operand layout of m64nNk16 (per
// warp the m16n8 accumulator layout is the m16k16 operand layout): k-step kt covers keys
// 16 kt .. 16 kt + 15. Score element i: row my_row0 + 8 ((i / 2) % 2), column
// (i / 4) 8 + 2 t4 + i % 2.
template <int HD>
__device__ __forceinline__ void SoftmaxTile(float (&s)[kBN / 2], float (&o)[HD / 2], float (&m)[2], float (&l)[2],
                                            uint32_t (&pa)[kBN / 16][4], const int* cp, bool needs_mask,
                                            const int (&row_pos)[2], float scale_log2) {
  const int t4 = threadIdx.x % 4;
  if (needs_mask) {
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

  // Online softmax (base 2, the 1/sqrt(d) scale folded into scale_log2).
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
    const float mb = m_use * scale_log2;
    float sum = 0.0f;
#pragma unroll
    for (int n = 0; n < kBN / 8; ++n) {
      s[n * 4 + 2 * h] = exp2f(fmaf(s[n * 4 + 2 * h], scale_log2, -mb));
      s[n * 4 + 2 * h + 1] = exp2f(fmaf(s[n * 4 + 2 * h + 1], scale_log2, -mb));
      sum += s[n * 4 + 2 * h] + s[n * 4 + 2 * h + 1];
    }
    l[h] = l[h] * corr + sum;
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) {
      o[n * 4 + 2 * h] *= corr;
      o[n * 4 + 2 * h + 1] *= corr;
    }
  }

#pragma unroll
  for (int kt = 0; kt < kBN / 16; ++kt) {
    pa[kt][0] = PackBf16(s[8 * kt + 0], s[8 * kt + 1]);
    pa[kt][1] = PackBf16(s[8 * kt + 2], s[8 * kt + 3]);
    pa[kt][2] = PackBf16(s[8 * kt + 4], s[8 * kt + 5]);
    pa[kt][3] = PackBf16(s[8 * kt + 6], s[8 * kt + 7]);
  }
}

}  // namespace
}  // namespace lazykv::cuda
