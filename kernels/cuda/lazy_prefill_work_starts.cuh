// The prefill kernels' work starts (PrefillAttentionParams::work_starts): each work tile's split
// entry range and first two KV tile descriptors, made by a small kernel before a launch (or
// reused from an earlier launch over the same tables: work_starts_made), so that a CTA reads them
// in one round of loads instead of walking its block table (a search over it, then two tiles:
// about five rounds of dependent loads). Included only by the prefill kernel headers.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/lazy_prefill_attention.h"
#include "kernels/cuda/lazy_prefill_cta.cuh"
#include "kernels/cuda/lazy_prefill_tiles.cuh"
#include "kernels/cuda/prefill_work_order.h"

namespace lazykv::cuda {
namespace {

// A work tile's start, made before the kernel by PrefillWorkStartsKernel (one per list index;
// PrefillAttentionParams::work_starts). At a work tile boundary the persistent kernel's copy
// warps read it in one round of independent loads; walking the table there took about 6 rounds
// of dependent loads queued behind their own copies, ~9% of the kernel's time at 1k keys (a
// second walk added that much: bench/results/prefill_order_2026-11-28.md). The one-tile kernel
// reads its CTA's start where it would walk the table before its first copies.
struct PrefillWorkStart {
  TileDesc first, second;  // the first two tiles' descriptors (MakeFirstTiles, no L2 prefetch)
  int e_hi;                // the entry range's end
  int kvh, pos_lo, pos_hi;
  int next;  // the list index of the next work tile with a query for the same CTA, or -1
};

// One warp a list index: its work start (inactive work tiles, which no CTA starts, are left
// unwritten). ctas: the persistent grid's size (a CTA's stride in the list; the one-tile
// kernel's list, OneTileWorkOrder, takes the list's count: no next work tile). It walks the launch's
// tables (all it reads) into shared memory before it waits for the grid before it, and writes
// `starts` only after: a kernel before it may still read them, and the prefill kernel's wait for
// this grid then also covers that one (what wrote the queries and keys).
constexpr int kWorkStartsWarps = 8;  // PrefillWorkStartsKernel's warps a block (a work tile each)

template <int HD>
__global__ void __launch_bounds__(kWorkStartsWarps * 32)
    PrefillWorkStartsKernel(const PrefillAttentionParams p, const WorkList list, int ctas, PrefillWorkStart* starts) {
  AllowDependentLaunch();
  __shared__ PrefillWorkStart made[kWorkStartsWarps];  // a warp's
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  const int index = static_cast<int>(blockIdx.x) * kWorkStartsWarps + warp;
  bool active = false;
  if (index < list.order.count) {
    const CtaWork w = WorkAt<HD>(p, list, index);
    active = w.active;
    if (active) {
      PrefillWorkStart* start = &made[warp];
      const int e_hi = MakeFirstTiles<HD>(p, w, list.log2bs, &start->first, &start->second, /*prefetch=*/false);
      int next = index + ctas;
      for (; next < list.order.count; next += ctas) {
        if (WorkAt<HD>(p, list, next).active) break;
      }
      if (lane == 0) {
        start->e_hi = e_hi;
        start->kvh = w.kvh;
        start->pos_lo = w.pos_lo;
        start->pos_hi = w.pos_hi;
        start->next = next < list.order.count ? next : -1;
      }
      __syncwarp();
    }
  }
  WaitForPriorGrid();
  if (active) {
    constexpr int kWords = static_cast<int>(sizeof(PrefillWorkStart) / sizeof(int));
    const int* from = reinterpret_cast<const int*>(&made[warp]);
    int* to = reinterpret_cast<int*>(starts + index);
    for (int i = lane; i < kWords; i += 32) to[i] = from[i];
  }
}

// The one-tile kernel's work tiles as a list (one query tile a group: PrefillWorkAt's index is
// head group + heads * (sequence-and-split + seqs * query tile from the last)), so that
// PrefillWorkStartsKernel makes its starts and a CTA finds its own (OneTileWorkIndex).
inline PrefillWorkOrder OneTileWorkOrder(dim3 grid) {
  return MakePrefillWorkOrder(static_cast<int>(grid.x), static_cast<int>(grid.y), static_cast<int>(grid.z), 1);
}
__device__ __forceinline__ int OneTileWorkIndex() {
  return static_cast<int>(blockIdx.x + gridDim.x * (blockIdx.z + gridDim.z * blockIdx.y));
}

// One warp (all lanes): MakeFirstTiles from a work start: the first two descriptors copied (a
// word a lane) and their keys and values asked of L2; returns the entry range's end. The loads
// go to L2 (ld.global.cg): another kernel wrote the start, on other SMs.
template <int HD>
__device__ __forceinline__ int ReadFirstTiles(const PrefillAttentionParams& p, const PrefillWorkStart& start,
                                              int log2bs, int kvh, TileDesc* first, TileDesc* second) {
  constexpr int kWords = static_cast<int>(sizeof(TileDesc) / sizeof(int));
  static_assert(kWords <= 32, "a descriptor is one word a lane");
  static_assert(offsetof(PrefillWorkStart, second) == sizeof(TileDesc), "the two descriptors back to back");
  const int lane = threadIdx.x & 31;
  const int* from = reinterpret_cast<const int*>(&start);
  const int a = lane < kWords ? __ldcg(from + lane) : 0, b = lane < kWords ? __ldcg(from + kWords + lane) : 0;
  const int e_hi = __ldcg(&start.e_hi);
  if (lane < kWords) {
    reinterpret_cast<int*>(first)[lane] = a;
    reinterpret_cast<int*>(second)[lane] = b;
  }
  __syncwarp();
  PrefetchTileToL2<HD>(p, *first, log2bs, kvh);
  PrefetchTileToL2<HD>(p, *second, log2bs, kvh);
  return e_hi;
}

}  // namespace
}  // namespace lazykv::cuda
