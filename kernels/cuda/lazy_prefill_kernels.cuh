// The lazy paged prefill two-warpgroup kernel (every thread copies, rotates and computes); the
// warp-specialized kernel is in lazy_prefill_specialized.cuh, the combine of splits in
// split_combine.cu. Included only by lazy_prefill_attention.cu.
//
// One CTA: 128 queries of one head, two warpgroups of 64 query rows each, against KV tiles
// of 128 keys double-buffered in shared memory through cp.async (all 256 threads copy).
// The query rows rotated by their positions, R(p) q, stay in shared memory as fp32: when the
// next KV tile has another delta d, each warp applies R(-d) to its 16 rows (one angle for all
// rows) while the tensor cores compute this tile's P V (which reads no query).
#pragma once

#include <cfloat>
#include <cstdint>

#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/lazy_prefill_attention.h"
#include "kernels/cuda/lazy_prefill_cta.cuh"
#include "kernels/cuda/lazy_prefill_math.cuh"
#include "kernels/cuda/lazy_prefill_query.cuh"
#include "kernels/cuda/lazy_prefill_tiles.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace lazykv::cuda {
namespace {

// Named barrier 1 between the two warpgroups (0 is __syncthreads).
__device__ __forceinline__ void WarpgroupsSync() { asm volatile("bar.sync 1, %0;\n" ::"n"(kThreads) : "memory"); }
__device__ __forceinline__ void WarpgroupsArrive() { asm volatile("bar.arrive 1, %0;\n" ::"n"(kThreads) : "memory"); }

// One CTA: one head, one tile of 128 queries (never packed: pack_heads 1), one split of the visible block table
// (splits > 1 write partial states to the workspace for the combine, split_combine.h).
// Per tile: scores, softmax, P V, each waited for, in one of two schedules (Schedule in
// lazy_prefill_tiles.cuh): kSerial, both warpgroups at once; kStagger, warpgroup 1 issues
// its scores once warpgroup 0's are done, so that one warpgroup's softmax runs while the
// other's products occupy the tensor cores (1.05-1.10x kSerial on the H100).
// Issuing the next tile's scores before this tile's softmax (as FlashAttention-3 does within
// a warpgroup) ran 1.2-1.3x slower than kStagger here at 253 registers
// (bench/results/cuda_prefill_2026-11-21b.md) and was dropped.
template <int HD, int kSchedule>
__global__ void __launch_bounds__(kThreads, 1)
    LazyPrefillKernel(const PrefillAttentionParams p, int log2bs, float scale_log2, int splits) {
  AllowDependentLaunch();  // launched by LaunchDependent (dependent_launch.cuh): the combine may come in
  using L = SmemLayout<HD>;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - (SmemAddr(smem_raw) & 1023)) & 1023);
  const CtaWork w = MakeCtaWork<HD>(p, log2bs, splits, /*log2_pack=*/0);
  if (!w.active) return;
  const int warp = threadIdx.x / 32;
  const int wg = warp / 4;
  const int my_row0 = warp * kRowsPerWarp + (threadIdx.x % 32) / 4;  // this thread's rows: my_row0, my_row0 + 8

  TileDesc* desc = reinterpret_cast<TileDesc*>(smem + L::kDesc);
  int* col_pos = reinterpret_cast<int*>(smem + L::kColPos);
  const uint32_t q_smem = SmemAddr(smem + L::kQ);
  const uint32_t k_smem = SmemAddr(smem + L::kK);
  const uint32_t v_smem = SmemAddr(smem + L::kV);

  // Only warp 0 walks the block table, so only it needs the split's entry range. Until
  // WaitForPriorGrid, only the launch's tables are read (lazy_prefill_attention.h).
  int e_hi = 0;
  if (warp == 0) e_hi = MakeFirstTiles<HD>(p, w, log2bs, &desc[0], &desc[1]);
  WaitForPriorGrid();  // before anything an earlier kernel wrote (the queries, the new keys) is read
  __syncthreads();
  if (!desc[0].valid) {
    WriteEmptyRows<HD>(p, w, threadIdx.x, kThreads);
    return;
  }
  LoadRawQuery<HD, kThreads>(w, SmemAddr(smem + L::kRawQ), threadIdx.x);
  CpAsyncCommit();
  LoadTile<HD, kThreads>(p, desc[0], log2bs, w.kvh, k_smem, v_smem, col_pos, threadIdx.x);
  CpAsyncCommit();
  CpAsyncWait<1>();  // the raw query rows (the first tile may still be in flight)
  __syncthreads();
  // Each warp reads and rewrites only its own rows of the query: no barrier needed.
  float* raw_q = reinterpret_cast<float*>(smem + L::kRawQ);
  const int lane = threadIdx.x % 32;
  RotateRowsByPosition<HD, 32, kRowsPerWarp>(p, raw_q, warp * kRowsPerWarp, w.pos_lo, lane);
  __syncwarp();
  int q_delta = desc[0].delta;
  WriteRowsForDelta<HD, 32, kRowsPerWarp>(p, raw_q, warp * kRowsPerWarp, q_delta, lane, smem + L::kQ);
  wgmma::FenceProxyAsync();

  float o[HD / 2];
#pragma unroll
  for (int i = 0; i < HD / 2; ++i) o[i] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const int row_pos[2] = {RowPosition(w, my_row0), RowPosition(w, my_row0 + 8)};

  for (int j = 0;; ++j) {
    CpAsyncWait<0>();
    wgmma::FenceProxyAsync();
    __syncthreads();  // tile j is in stage j & 1; every warp is done with stage (j + 1) & 1
    const int stage = j & 1;
    const TileDesc& d = desc[j % kDescSlots];
    const TileDesc& dn = desc[(j + 1) % kDescSlots];
    const bool has_next = dn.valid;
    const int next_delta = dn.delta;
    const bool needs_mask = d.needs_mask;
    if (has_next) {
      LoadTile<HD, kThreads>(p, dn, log2bs, w.kvh, k_smem + (stage ^ 1) * L::kKvBytes,
                             v_smem + (stage ^ 1) * L::kKvBytes, col_pos + (stage ^ 1) * kBN, threadIdx.x);
      CpAsyncCommit();
    }

    float s[kBN / 2];
    if (kSchedule == kStagger && wg == 1) WarpgroupsSync();
    IssueScores<HD>(s, q_smem + wg * 64 * 128, k_smem + stage * L::kKvBytes);
    wgmma::Wait<0>();
    wgmma::PinRegisters(s);
    if (kSchedule == kStagger && wg == 0) WarpgroupsArrive();

    uint32_t pa[kBN / 16][4];
    SoftmaxTile<HD>(s, o, m, l, pa, col_pos + stage * kBN, needs_mask, row_pos, scale_log2);
    IssueValues<HD>(o, pa, v_smem + stage * L::kKvBytes);
    // The tile after next, while the tensor cores work (off the path to the next barrier).
    if (warp == 0 && has_next) {
      NextTile(p, dn, e_hi, w.entries_per_tile, w.pos_lo, w.pos_hi, &desc[(j + 2) % kDescSlots]);
    }
    // While the tensor cores work (P V reads no query): the query rows for the next tile's
    // delta, if it differs. Every warp of this warpgroup has passed its wait on the scores
    // (they all issued P V), so no product reads the query buffer any more.
    if (has_next && next_delta != q_delta) {
      WriteRowsForDelta<HD, 32, kRowsPerWarp>(p, raw_q, warp * kRowsPerWarp, next_delta, lane, smem + L::kQ);
      wgmma::FenceProxyAsync();
      q_delta = next_delta;
    }
    wgmma::Wait<0>();
    wgmma::PinRegisters(o);
    if (!has_next) break;
  }
  WriteRows<HD>(p, w, o, m, l, my_row0, scale_log2);
}

}  // namespace
}  // namespace lazykv::cuda
