// The staged tensor-core product's building blocks, shared by the skinny GEMM kernels
// (skinny_mma_gemm.cu, which documents the layout) and bench/product_chain_probe.cu: a CTA of
// 4 warps multiplies a tile of 64 rows of W by up to 64 rows of X in stages of 64 columns of K,
// staged through shared memory by cp.async (swizzled for ldmatrix), with mma.sync m16n8k16
// into fp32 accumulators. Device code only; no state.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/mma_sync.cuh"
#include "kernels/cuda/skinny_mma_gemm.h"

namespace lazykv::cuda::skinny_mma {

using bf16 = __nv_bfloat16;
using async_copy::CpAsync16;
using async_copy::CpAsync16Streamed;
using mma::Ldmatrix2;
using mma::Ldmatrix4;
using mma::Mma;

enum class Epilogue { kStore, kSwiGlu };

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kStageK = 64;           // columns of K a stage: 128 bytes of a bf16 row
constexpr int kChunks = kStageK / 8;  // 16-byte chunks of a bf16 row in a stage
constexpr int kWChunksPerThread = kSkinnyMmaTileOut * kChunks / kThreads;
static_assert(kSkinnyMmaTileOut == 16 * kWarps, "a warp takes 16 rows of W");
static_assert(kWChunksPerThread * kThreads == kSkinnyMmaTileOut * kChunks, "whole chunks a thread");

// 16-byte chunks of a stage's row of X.
template <typename XT>
inline constexpr int kXChunks = kStageK* static_cast<int>(sizeof(XT)) / 16;

// Stages in flight: four where they fit the 48 KB of static shared memory, else three.
template <int kNTiles, typename XT>
inline constexpr int kStages = 4 * 16 * (kSkinnyMmaTileOut * kChunks + 8 * kNTiles * kXChunks<XT>) <= 48 * 1024 ? 4 : 3;

// The stages in shared memory: W [stage][64 rows x 8 chunks], X [stage][8 * kNTiles rows x
// XChunks]. 48 KB at most with the default count (the static limit): the split's flag and the
// SwiGLU epilogue's exchange reuse W's buffers once the last stage is multiplied. Another count
// (in dynamic shared memory) is for measurements (bench/product_chain_probe.cu).
template <int kNTiles, typename XT, int kCount = kStages<kNTiles, XT>>
struct Stages {
  uint4 w[kCount][kSkinnyMmaTileOut * kChunks];
  uint4 x[kCount][8 * kNTiles * kXChunks<XT>];
};

__device__ __forceinline__ int Swizzled(int row, int chunk, int chunks_per_row) {
  return row * chunks_per_row + (chunk ^ (row & 7));
}

// The row of W that row r of a tile starting at output tile0 holds. kStore: output tile0 + r.
// kSwiGlu (tile0 a multiple of 32 of `out` = hidden): gate row tile0 + r for r < 32, up row
// hidden + tile0 + r - 32 after. Rows past the outputs repeat the last (loaded, never written).
template <Epilogue kEpilogue>
__device__ __forceinline__ int WRow(int tile0, int r, int out) {
  if constexpr (kEpilogue == Epilogue::kStore) {
    return min(tile0 + r, out - 1);
  } else {
    return min(tile0 + r % 32, out - 1) + (r < 32 ? 0 : out);
  }
}

// Stage columns from k0 of the tile's W into buffer `buffer`; columns past `in` are zeros.
template <Epilogue kEpilogue, int kNTiles, typename XT, int kCount>
__device__ __forceinline__ void LoadW(Stages<kNTiles, XT, kCount>& sm, int buffer, const bf16* w, int in, int out,
                                      int tile0, int k0) {
#pragma unroll
  for (int j = 0; j < kWChunksPerThread; ++j) {
    const int i = threadIdx.x + j * kThreads;
    const int r = i / kChunks, c = i % kChunks;
    const int k = k0 + c * 8;
    const bool inside = k < in;
    CpAsync16Streamed(&sm.w[buffer][Swizzled(r, c, kChunks)],
                      w + static_cast<size_t>(WRow<kEpilogue>(tile0, r, out)) * in + (inside ? k : 0), inside ? 16 : 0);
  }
}

// The same stage of X: rows past `rows` and columns past `in` are zeros.
template <int kNTiles, typename XT, int kCount>
__device__ __forceinline__ void LoadX(Stages<kNTiles, XT, kCount>& sm, int buffer, const XT* x, int rows, int in,
                                      int k0) {
  constexpr int kChunksX = kXChunks<XT>, kElems = 16 / sizeof(XT);
  for (int i = threadIdx.x; i < 8 * kNTiles * kChunksX; i += kThreads) {
    const int r = i / kChunksX, c = i % kChunksX;
    const int k = k0 + c * kElems;
    const bool inside = r < rows && k < in;
    CpAsync16(&sm.x[buffer][Swizzled(r, c, kChunksX)], x + (inside ? static_cast<size_t>(r) * in + k : 0),
              inside ? 16 : 0);
  }
}

__device__ __forceinline__ uint32_t PackBf16(float2 v) {
  const __nv_bfloat162 b = __floats2bfloat162_rn(v.x, v.y);
  return *reinterpret_cast<const uint32_t*>(&b);
}

// The B fragment of fp32 X for n-tile rows 8 * nt.. and the 16 columns from 16 * kk of the
// stage: lane (g, t) = (lane / 4, lane % 4) takes row g's columns 2t, 2t + 1 and 2t + 8, 2t + 9,
// rounded to bf16 pairs (the lower column in the lower half, as ldmatrix would load them).
template <int kNTiles, int kCount>
__device__ __forceinline__ void FloatBFragment(const Stages<kNTiles, float, kCount>& sm, int buffer, int nt, int kk,
                                               int lane, uint32_t& b0, uint32_t& b1) {
  constexpr int kChunksX = kXChunks<float>;
  const int r = 8 * nt + lane / 4, k = 16 * kk + 2 * (lane % 4);
  const float* lo = reinterpret_cast<const float*>(&sm.x[buffer][Swizzled(r, k / 4, kChunksX)]) + k % 4;
  const float* hi = reinterpret_cast<const float*>(&sm.x[buffer][Swizzled(r, k / 4 + 2, kChunksX)]) + k % 4;
  b0 = PackBf16(*reinterpret_cast<const float2*>(lo));
  b1 = PackBf16(*reinterpret_cast<const float2*>(hi));
}

// The warp's 16 rows of W times the stage's X, added to acc[n-tile]: per 16 columns, one
// ldmatrix.x4 of W (the A fragment: rows 0-7 and 8-15, columns 0-7 and 8-15, from lanes
// 0-7, 8-15, 16-23, 24-31) and the B fragments: for bf16 X one ldmatrix per 16 rows (rows 0-7
// at columns 0-7 and 8-15, then rows 8-15 likewise; .x2 for one tile), for fp32 X built from
// pairs.
template <int kNTiles, typename XT, int kCount>
__device__ __forceinline__ void MultiplyStage(const Stages<kNTiles, XT, kCount>& sm, int buffer, int warp, int lane,
                                              float (&acc)[kNTiles][4]) {
  const int a_row = 16 * warp + (lane & 7) + ((lane >> 3) & 1) * 8;
  const int b_row = (lane & 7) + (kNTiles >= 2 ? (lane >> 4) * 8 : 0);
#pragma unroll
  for (int kk = 0; kk < kStageK / 16; ++kk) {
    uint32_t a[4];
    Ldmatrix4(a, &sm.w[buffer][Swizzled(a_row, 2 * kk + (lane >> 4), kChunks)]);
    if constexpr (std::is_same_v<XT, float>) {
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt) {
        uint32_t b0, b1;
        FloatBFragment(sm, buffer, nt, kk, lane, b0, b1);
        Mma(acc[nt], a, b0, b1);
      }
    } else {
      const int b_chunk_index = Swizzled(b_row, 2 * kk + ((lane >> 3) & 1), kChunks);
      const uint4* b_chunk = &sm.x[buffer][b_chunk_index];
      if constexpr (kNTiles >= 2) {  // X rows 16 * pair.. in n-tiles 2 * pair and 2 * pair + 1
#pragma unroll
        for (int pair = 0; pair < kNTiles / 2; ++pair) {
          uint32_t b[4];
          // Rows 16 more: the same chunk of a row whose swizzle (row % 8) is the same.
          Ldmatrix4(b, b_chunk + pair * 16 * kChunks);
          Mma(acc[2 * pair], a, b[0], b[1]);
          Mma(acc[2 * pair + 1], a, b[2], b[3]);
        }
      } else {
        uint32_t b[2];
        Ldmatrix2(b, b_chunk);
        Mma(acc[0], a, b[0], b[1]);
      }
    }
  }
}

}  // namespace lazykv::cuda::skinny_mma
