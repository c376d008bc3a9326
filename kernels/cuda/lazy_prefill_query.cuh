// The lazy prefill kernels' query: the rotations that turn raw fp32 query rows into what
// wgmma reads for a KV tile of delta d, R(p - d) q rounded once to bf16 — a 128-byte-swizzled
// tile in shared memory, written row by row. Included only by the prefill kernels.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/lazy_prefill_attention.h"
#include "kernels/cuda/lazy_prefill_tiles.cuh"
#include "kernels/cuda/rope_device.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace lazykv::cuda {
namespace {

// kLaneThreads threads over query rows: thread t owns frequencies f0 and f0 + 1 of rows
// rsub, rsub + kRowsPerStep, ... Interleaved pairs: columns 2 f0 .. 2 f0 + 3 hold
// (u0, v0, u1, v1); rotate-half: columns f0, f0 + 1 hold u0, u1 and f0 + half, f0 + half + 1
// hold v0, v1.
template <int HD, int kLaneThreads>
struct QueryLanes {
  static constexpr int kLanesPerRow = HD / 4;
  static constexpr int kRowsPerStep = kLaneThreads / kLanesPerRow;
  int f0, rsub, col_a, col_b;
  bool interleaved;
  __device__ QueryLanes(RopeStyle rope_style, int t) {
    f0 = 2 * (t % kLanesPerRow);
    rsub = t / kLanesPerRow;
    interleaved = rope_style == RopeStyle::kInterleaved;
    col_a = interleaved ? 2 * f0 : f0;
    col_b = f0 + HD / 2;
  }
  // The lane's four values of one row of HD floats (shared or global memory; plain loads).
  __device__ float4 LoadRow(const float* row) const {  // (u0, v0, u1, v1)
    if (interleaved) return *reinterpret_cast<const float4*>(row + col_a);
    const float2 a = *reinterpret_cast<const float2*>(row + col_a);
    const float2 b = *reinterpret_cast<const float2*>(row + col_b);
    return make_float4(a.x, b.x, a.y, b.y);
  }
  // Row r of the raw tile (RawQueryIndex's layout).
  __device__ float4 Load(const float* tile, int r) const { return LoadRow(tile + RawQueryIndex<HD>(r, 0)); }
  __device__ void Store(float* tile, int r, float4 x) const {
    if (interleaved) {
      *reinterpret_cast<float4*>(tile + RawQueryIndex<HD>(r, col_a)) = x;
    } else {
      *reinterpret_cast<float2*>(tile + RawQueryIndex<HD>(r, col_a)) = make_float2(x.x, x.z);
      *reinterpret_cast<float2*>(tile + RawQueryIndex<HD>(r, col_b)) = make_float2(x.y, x.w);
    }
  }
  // Rounds the lane's four values to bf16 into row `tile_row` of the swizzled query tile.
  __device__ void StoreBf16(unsigned char* q_smem, int tile_row, float4 y) const {
    if (interleaved) {  // 4 consecutive columns, inside one 16-byte chunk
      *reinterpret_cast<uint2*>(q_smem + wgmma::SwizzledOffset<kBM>(tile_row, col_a / 8) + (col_a % 8) * 2) =
          make_uint2(PackBf16(y.x, y.y), PackBf16(y.z, y.w));
    } else {
      *reinterpret_cast<uint32_t*>(q_smem + wgmma::SwizzledOffset<kBM>(tile_row, col_a / 8) + (col_a % 8) * 2) =
          PackBf16(y.x, y.z);
      *reinterpret_cast<uint32_t*>(q_smem + wgmma::SwizzledOffset<kBM>(tile_row, col_b / 8) + (col_b % 8) * 2) =
          PackBf16(y.y, y.w);
    }
  }
};

// (u + iv) (c + is) for both frequencies of a lane.
__device__ __forceinline__ float4 Rotate(float4 x, const float (&c)[2], const float (&s)[2]) {
  return make_float4(x.x * c[0] - x.y * s[0], x.x * s[0] + x.y * c[0], x.z * c[1] - x.w * s[1],
                     x.z * s[1] + x.w * c[1]);
}

// Advances both frequencies' angles by the step (cs, ss) (fp32 complex products).
__device__ __forceinline__ void AdvanceAngle(float (&c)[2], float (&s)[2], const float (&cs)[2], const float (&ss)[2]) {
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const float cn = c[j] * cs[j] - s[j] * ss[j];
    s[j] = s[j] * cs[j] + c[j] * ss[j];
    c[j] = cn;
  }
}

// Once per CTA: kLaneThreads threads (t) turn raw query rows [row0, row0 + kRows) of the fp32
// tile (shared memory) into R(position) q in place; row r sits at position
// pos_lo + (r >> log2_pack) (CtaWork's rows; 1 << log2_pack must divide the rows per step,
// MaxPrefillPack for 128 threads, and row0). The angle of a thread's first row is
// formed and reduced in double (exact at any position); later rows advance it by a rotation
// of the row step (error ~1e-6 rad after 32 steps, far under the bf16 rounding that comes
// later). A thread touches only its own elements, which WriteRowsForDelta reads back with the
// same (kLaneThreads, row0) split. Nothing to do where the rows came rotated (p.q_rotated).
template <int HD, int kLaneThreads, int kRows>
__device__ __forceinline__ void RotateRowsByPosition(const PrefillAttentionParams& p, float* tile, int row0,
                                                     long long pos_lo, int t, int log2_pack = 0) {
  if (p.q_rotated) return;
  using Lanes = QueryLanes<HD, kLaneThreads>;
  const Lanes lanes(p.kv.rope_style, t);
  float c[2], s[2], cs[2], ss[2];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const double th = __ldg(p.kv.inv_freq + lanes.f0 + j);
    RopeSinCos(th, pos_lo + ((row0 + lanes.rsub) >> log2_pack), &s[j], &c[j]);
    RopeSinCos(th, Lanes::kRowsPerStep >> log2_pack, &ss[j], &cs[j]);
  }
#pragma unroll 4
  for (int i = 0; i < kRows / Lanes::kRowsPerStep; ++i) {
    const int r = row0 + lanes.rsub + i * Lanes::kRowsPerStep;
    lanes.Store(tile, r, Rotate(lanes.Load(tile, r), c, s));
    AdvanceAngle(c, s, cs, ss);
  }
}

// The query rows [row0, row0 + kRows) for a tile of delta d: R(-d) applied to R(position) q
// (the same angle for every row, so one sine and cosine per frequency), rounded once to
// bf16 into the swizzled query tile that wgmma reads.
template <int HD, int kLaneThreads, int kRows>
__device__ __forceinline__ void WriteRowsForDelta(const PrefillAttentionParams& p, const float* tile, int row0,
                                                  int delta, int t, unsigned char* q_smem) {
  using Lanes = QueryLanes<HD, kLaneThreads>;
  const Lanes lanes(p.kv.rope_style, t);
  float c[2], s[2];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    RopeSinCos(__ldg(p.kv.inv_freq + lanes.f0 + j), -static_cast<long long>(delta), &s[j], &c[j]);
  }
#pragma unroll 4
  for (int i = 0; i < kRows / Lanes::kRowsPerStep; ++i) {
    const int r = row0 + lanes.rsub + i * Lanes::kRowsPerStep;
    lanes.StoreBf16(q_smem, r, Rotate(lanes.Load(tile, r), c, s));
  }
}

// The row (0 .. 128 / (HD / 16) - 1) whose columns thread t of the rotation warpgroup
// rotates first in WriteQueryForDelta (then every 128 / (HD / 16) rows on). At head dim 128 the
// two quarter-warps of a half-warp take rows 4 apart, so that their 8-byte stores, whose
// swizzle XORs the chunk with row & 7, land in different banks.
template <int HD>
__device__ __forceinline__ int QueryRowForThread(int t) {
  constexpr int kLanes = HD / 16;
  if constexpr (kLanes == 8) {  // rows 0 .. 15: warp w, quarter q (two quarters per half-warp)
    const int w = t / 32, q = (t % 32) / 8;
    return (w & 1) * 8 + (w >> 1) * 2 + (q & 1) * 4 + (q >> 1);
  } else {
    return t / kLanes;
  }
}

// The rotation warpgroup's query for a delta d (128 threads, t): R(-d) applied to the whole
// fp32 tile of R(position) q, rounded once to bf16 into the swizzled query tile. kLanes =
// HD / 16 threads share a row; in step h thread g of a row reads, with 16-byte loads, the
// 4 columns at 4 g + 4 kLanes h and their partners HD / 2 further (rotate-half), or the 4
// columns at 4 g + 8 kLanes h and the 4 at 4 kLanes further (interleaved pairs). At head dim
// 128 a load's quarter-warp then reads 128 contiguous bytes of one row: no bank conflicts
// (with 8 g + 4 h before, two threads shared each bank; at head dim 64 a quarter-warp still
// spans two rows). Sines and cosines are made two frequencies a lane and fetched by
// shuffles. Rows are a multiple of 8 apart, so each store's swizzle is fixed per thread and
// the addresses step by whole rows. A different split from RotateRowsByPosition's: a
// barrier goes between them.
template <int HD>
__device__ __forceinline__ void WriteQueryForDelta(const PrefillAttentionParams& p, const float* raw, int delta, int t,
                                                   uint32_t q_tile) {
  constexpr int kLanes = HD / 16;         // threads per row
  constexpr int kRowStep = 128 / kLanes;  // 16 or 32: a multiple of 8
  const int lane = t % 32, g = t % kLanes, r0 = QueryRowForThread<HD>(t);
  float c2[2], s2[2];  // frequencies 2 lane, 2 lane + 1
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    RopeSinCos(__ldg(p.kv.inv_freq + min(2 * lane + j, HD / 2 - 1)), -static_cast<long long>(delta), &s2[j], &c2[j]);
  }
  const bool interleaved = p.kv.rope_style == RopeStyle::kInterleaved;
#pragma unroll 1
  for (int h = 0; h < 2; ++h) {
    // The step's two 16-byte loads of a row: interleaved, pairs at 4 g + 8 kLanes h and 4 kLanes
    // further; rotate-half, the columns 4 g + 4 kLanes h and their partners HD / 2 further.
    // Each result goes to the same columns, so to chunk col / 8 of the swizzled row.
    const int col0 = 4 * g + (interleaved ? 8 : 4) * kLanes * h;
    const int col1 = col0 + (interleaved ? 4 * kLanes : HD / 2);
    // Frequencies of the four values a thread rotates, held by lane f / 2, slot f & 1:
    // interleaved, col0 / 2 + {0, 1} and col1 / 2 + {0, 1}; rotate-half, col0 + {0 .. 3}.
    float c[2][2], s[2][2];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int src = interleaved ? (j < 2 ? col0 : col1) / 4 : col0 / 2 + j / 2;
      c[j / 2][j % 2] = __shfl_sync(0xffffffffu, c2[j & 1], src);
      s[j / 2][j % 2] = __shfl_sync(0xffffffffu, s2[j & 1], src);
    }
    // Rows r0 + i kRowStep: the loads step by kRowStep rows of the raw tile and the stores by
    // kRowStep swizzled rows (r & 7 is the same for all of them).
    const float* load0 = raw + RawQueryIndex<HD>(r0, col0);
    const float* load1 = raw + RawQueryIndex<HD>(r0, col1);
    const uint32_t store0 = q_tile + wgmma::SwizzledOffset<kBM>(r0, col0 / 8) + 8 * (g & 1);
    const uint32_t store1 = q_tile + wgmma::SwizzledOffset<kBM>(r0, col1 / 8) + 8 * (g & 1);
#pragma unroll 1
    for (int i = 0; i < kBM / kRowStep; ++i) {
      const float4 x = *reinterpret_cast<const float4*>(load0 + i * kRowStep * HD);
      const float4 y = *reinterpret_cast<const float4*>(load1 + i * kRowStep * HD);
      uint32_t w[4];
      if (interleaved) {  // x, y: (u0, v0, u1, v1) each
        const float4 a = Rotate(x, c[0], s[0]), b = Rotate(y, c[1], s[1]);
        w[0] = PackBf16(a.x, a.y);
        w[1] = PackBf16(a.z, a.w);
        w[2] = PackBf16(b.x, b.y);
        w[3] = PackBf16(b.z, b.w);
      } else {  // x: u of four frequencies, y: their v; rotated as (u, v) pairs
        const float4 a = Rotate(make_float4(x.x, y.x, x.y, y.y), c[0], s[0]);
        const float4 b = Rotate(make_float4(x.z, y.z, x.w, y.w), c[1], s[1]);
        w[0] = PackBf16(a.x, a.z);
        w[1] = PackBf16(b.x, b.z);
        w[2] = PackBf16(a.y, a.w);
        w[3] = PackBf16(b.y, b.w);
      }
      asm volatile("st.shared.v2.b32 [%0], {%1, %2};\n" ::"r"(store0 + i * kRowStep * 128), "r"(w[0]), "r"(w[1])
                   : "memory");
      asm volatile("st.shared.v2.b32 [%0], {%1, %2};\n" ::"r"(store1 + i * kRowStep * 128), "r"(w[2]), "r"(w[3])
                   : "memory");
    }
  }
}

}  // namespace
}  // namespace lazykv::cuda
