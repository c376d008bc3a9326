// The lazy prefill kernels' query: the rotations that turn raw fp32 query rows into what
// wgmma reads for a KV tile of delta d, R(p - d) q rounded once to bf16 — a 128-byte-swizzled
// tile in shared memory, written row by row (the two-warpgroup kernel) or by each consumer
// thread for the fragments its own wgmma reads (the warp-specialized kernel). Included only by
// the prefill kernels.
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
  __device__ QueryLanes(int rope_style, int t) {
    f0 = 2 * (t % kLanesPerRow);
    rsub = t / kLanesPerRow;
    interleaved = rope_style == 0;
    col_a = interleaved ? 2 * f0 : f0;
    col_b = f0 + HD / 2;
  }
  // Row r of the raw tile (RawQueryIndex's layout).
  __device__ float4 Load(const float* tile, int r) const {  // (u0, v0, u1, v1)
    if (interleaved) return *reinterpret_cast<const float4*>(tile + RawQueryIndex<HD>(r, col_a));
    const float2 a = *reinterpret_cast<const float2*>(tile + RawQueryIndex<HD>(r, col_a));
    const float2 b = *reinterpret_cast<const float2*>(tile + RawQueryIndex<HD>(r, col_b));
    return make_float4(a.x, b.x, a.y, b.y);
  }
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
// tile (shared memory) into R(position) q in place. The angle of a thread's first row is
// formed and reduced in double (exact at any position); later rows advance it by a rotation
// of the row step (error ~1e-6 rad after 32 steps, far under the bf16 rounding that comes
// later). A thread touches only its own elements, which WriteRowsForDelta reads back with the
// same (kLaneThreads, row0) split.
template <int HD, int kLaneThreads, int kRows>
__device__ __forceinline__ void RotateRowsByPosition(const PrefillAttentionParams& p, float* tile, int row0,
                                                     long long pos_lo, int t) {
  using Lanes = QueryLanes<HD, kLaneThreads>;
  const Lanes lanes(p.rope_style, t);
  float c[2], s[2], cs[2], ss[2];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const double th = __ldg(p.inv_freq + lanes.f0 + j);
    RopeSinCos(th, pos_lo + row0 + lanes.rsub, &s[j], &c[j]);
    RopeSinCos(th, Lanes::kRowsPerStep, &ss[j], &cs[j]);
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
  const Lanes lanes(p.rope_style, t);
  float c[2], s[2];
#pragma unroll
  for (int j = 0; j < 2; ++j) RopeSinCos(__ldg(p.inv_freq + lanes.f0 + j), -static_cast<long long>(delta), &s[j], &c[j]);
#pragma unroll 4
  for (int i = 0; i < kRows / Lanes::kRowsPerStep; ++i) {
    const int r = row0 + lanes.rsub + i * Lanes::kRowsPerStep;
    lanes.StoreBf16(q_smem, r, Rotate(lanes.Load(tile, r), c, s));
  }
}

// The (cos, sin) of -d theta_f for frequencies f < HD / 2, spread over a warp: lane l holds
// f = l in (c[0], s[0]) and f = l + 32 in (c[1], s[1]); Get fetches any f by a shuffle.
template <int HD>
struct WarpDeltaSinCos {
  float c[2], s[2];
  __device__ WarpDeltaSinCos(const PrefillAttentionParams& p, int delta, int lane) {
#pragma unroll
    for (int h = 0; h < (HD / 2 + 31) / 32; ++h) {
      RopeSinCos(__ldg(p.inv_freq + min(lane + 32 * h, HD / 2 - 1)), -static_cast<long long>(delta), &s[h], &c[h]);
    }
  }
  // Frequency 32 h + l; h must be known at compile time (registers are not indexable).
  __device__ float2 Get(int h, int l) const {
    return make_float2(__shfl_sync(0xffffffffu, c[h], l), __shfl_sync(0xffffffffu, s[h], l));
  }
};

// The warp-specialized kernel's consumers keep R(p) q (fp32) re-laid in shared memory so that
// a rotation reads each thread's values with 16-byte loads at fixed offsets: slot i of
// consumer thread T (0..255) is float4 i * 256 + T. Thread T's values are its wgmma A
// fragments' (rows r0 and r0 + 8, columns 16 kt + 8 h + 2 t4 + {0, 1}), HD / 8 slots:
//  - rotate-half, slot (kt, h, e) for kt < HD / 32: row r0 + 8 e, columns col, col + 1 and
//    their partners col + HD / 2, col + HD / 2 + 1 (col = 16 kt + 8 h + 2 t4);
//  - interleaved, slot (kt, h): columns col, col + 1 (one pair) of rows r0 and r0 + 8.
// Both halves of every rotation pair are the thread's, so no value crosses threads.
constexpr int kConsumerThreads = 256;

template <int HD>
__device__ __forceinline__ void LoadQuerySlots(const float* raw, bool interleaved, int r0, int t4,
                                               float4 (&slot)[HD / 8]) {
  const auto pair = [&](int row, int col) {
    return *reinterpret_cast<const float2*>(raw + RawQueryIndex<HD>(row, col));
  };
  if (interleaved) {
#pragma unroll
    for (int kt = 0; kt < HD / 16; ++kt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int col = 16 * kt + 8 * h + 2 * t4;
        const float2 a = pair(r0, col), b = pair(r0 + 8, col);
        slot[2 * kt + h] = make_float4(a.x, a.y, b.x, b.y);
      }
    }
    return;
  }
#pragma unroll
  for (int kt = 0; kt < HD / 32; ++kt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int row = r0 + 8 * e, col = 16 * kt + 8 * h + 2 * t4;
        const float2 u = pair(row, col), v = pair(row, col + HD / 2);
        slot[4 * kt + 2 * h + e] = make_float4(u.x, u.y, v.x, v.y);
      }
    }
  }
}

// One consumer thread's share of the query tile for a KV tile of delta d: R(-d) applied to
// its slots of R(p) q, rounded once to bf16 into the swizzled tile (q_tile: its shared-memory
// address, 1024-aligned) that wgmma reads. The whole warp calls it (shuffles).
template <int HD>
__device__ __forceinline__ void WriteFragmentsForDelta(const PrefillAttentionParams& p, const float4* slots,
                                                       int delta, int r0, uint32_t q_tile) {
  const int lane = threadIdx.x % 32, t4 = lane % 4;
  const WarpDeltaSinCos<HD> cs(p, delta, lane);
  // Chunk m of rows r0 (+ 8 e): the swizzle XORs the chunk with the row (mod 8), which only
  // flips bits 4..6 of this base, so each store's address is one XOR and an immediate.
  const uint32_t base = q_tile + r0 * 128 + ((r0 & 7) << 4) + 4 * t4;
  const auto store = [&](int chunk, int e, float lo, float hi) {
    const uint32_t addr = (base ^ ((chunk & 7) << 4)) + (chunk >> 3) * (kBM * 128) + e * 1024;
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(PackBf16(lo, hi)) : "memory");
  };
  if (p.rope_style == 0) {  // interleaved pairs: columns 2 f, 2 f + 1
#pragma unroll
    for (int kt = 0; kt < HD / 16; ++kt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float2 r = cs.Get(kt / 4, (8 * kt + 4 * h + t4) % 32);
        const float4 x = slots[(2 * kt + h) * kConsumerThreads];
        store(2 * kt + h, 0, x.x * r.x - x.y * r.y, x.x * r.y + x.y * r.x);
        store(2 * kt + h, 1, x.z * r.x - x.w * r.y, x.z * r.y + x.w * r.x);
      }
    }
    return;
  }
#pragma unroll
  for (int kt = 0; kt < HD / 32; ++kt) {  // rotate-half pairs: columns f, f + HD / 2
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int col = 16 * kt + 8 * h + 2 * t4;
      const float2 r0c = cs.Get(kt / 2, col % 32), r1c = cs.Get(kt / 2, (col + 1) % 32);
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float4 x = slots[(4 * kt + 2 * h + e) * kConsumerThreads];  // (u0, u1, v0, v1)
        store(2 * kt + h, e, x.x * r0c.x - x.z * r0c.y, x.y * r1c.x - x.w * r1c.y);
        store(2 * kt + h + HD / 16, e, x.x * r0c.y + x.z * r0c.x, x.y * r1c.y + x.w * r1c.x);
      }
    }
  }
}

}  // namespace
}  // namespace lazykv::cuda
