// What every lazy prefill CTA does around its main loop, whichever kernel runs it: which
// (head, query tile, sequence, split) it is, the block-table entries its split covers, and
// the output of its rows (normalized, or a split's partial state in split_combine.h's layout).
// Included only by the prefill kernels.
#pragma once

#include <cfloat>
#include <cstddef>
#include <cstdint>

#include "kernels/cuda/entry_search.h"
#include "kernels/cuda/lazy_prefill_attention.h"
#include "kernels/cuda/lazy_prefill_tiles.cuh"
#include "kernels/cuda/prefill_work_order.h"
#include "kernels/cuda/softmax_merge.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace lazykv::cuda {
namespace {

struct CtaWork {
  bool active;  // the CTA's query tile holds at least one query
  int head, seq, split, splits;
  // Tile row r is query r >> log2_pack of the tile, head head + (r & (pack - 1)) (pack =
  // 1 << log2_pack heads of one KV group; 1: row r is query r of one head).
  int log2_pack;
  int n_heads;
  int rows;            // rows in use (up to kBM): the tile's queries times pack
  int pos_lo, pos_hi;  // positions of its first and last query
  int kvh, entries_per_tile;
  const float* q_tile;  // row r at q_tile + RowPair(r) * head_dim
  // Row r of the output at out_tile + RowPair(r) * splits * head_dim: the output itself, or
  // this split's unnormalized partial, whose max (log2 units) is at m_tile[RowPair(r) * splits]
  // and sum PrefillWorkspacePairs(p) * splits floats further (split_combine.h's layout;
  // m_tile null when unsplit).
  float* out_tile;
  float* m_tile;
};

// Tile row r's (query row, head) pair, counted from the tile's first pair: the offset of its
// query and output rows in units of head_dim floats, and of its split states in units of
// splits.
__device__ __forceinline__ int RowPair(const CtaWork& w, int r) {
  return (r >> w.log2_pack) * w.n_heads + (r & ((1 << w.log2_pack) - 1));
}

// The logical position of tile row r.
__device__ __forceinline__ int RowPosition(const CtaWork& w, int r) { return w.pos_lo + (r >> w.log2_pack); }

// The (query row, head) pairs a split workspace holds: max_queries_per_seq rows per sequence.
__host__ __device__ inline size_t PrefillWorkspacePairs(const PrefillAttentionParams& p) {
  return static_cast<size_t>(p.num_seqs) * p.max_queries_per_seq * p.n_heads;
}

// The work tile (hx, from_last, sz): head group hx (pack heads), query tile from_last counted
// from its sequence's last (prefill_work_order.h), sz = sequence * splits + split.
template <int HD>
__device__ __forceinline__ CtaWork MakeWork(const PrefillAttentionParams& p, int log2bs, int splits, int log2_pack,
                                            int hx, int from_last, int sz) {
  CtaWork w;
  w.log2_pack = log2_pack;
  w.n_heads = p.n_heads;
  w.head = hx << log2_pack;
  w.seq = sz / splits;
  w.split = sz % splits;
  w.splits = splits;
  const int q_begin = p.query_offsets[w.seq];
  const int n_q = p.query_offsets[w.seq + 1] - q_begin;
  const int per_tile = kBM >> log2_pack;                             // queries a tile
  const int tile = (n_q + per_tile - 1) / per_tile - 1 - from_last;  // from the sequence's first
  w.active = tile >= 0;
  const int query0 = max(tile, 0) * per_tile;  // the tile's first query (in range where inactive too)
  w.rows = min(kBM, (n_q - query0) << log2_pack);
  w.pos_lo = p.query_pos0[w.seq] + query0;
  w.pos_hi = RowPosition(w, w.rows - 1);
  w.kvh = w.head / (p.n_heads / p.kv.n_kv_heads);
  w.entries_per_tile = p.kv.block_size >= kBN ? 1 : (kBN >> log2bs);
  const size_t out_index = static_cast<size_t>(q_begin + query0) * p.n_heads + w.head;  // (query row, head)
  w.q_tile = p.q + out_index * HD;
  // Splits write partial states (split_combine.h): pair out_index's state for this split.
  const SplitPartials<float> part = SplitPartialsIn(p.workspace, PrefillWorkspacePairs(p), splits);
  const size_t state = SplitStateIndex(out_index, w.split, splits);
  w.out_tile = splits == 1 ? p.out + out_index * HD : part.acc + state * HD;
  w.m_tile = splits == 1 ? nullptr : part.m + state;
  return w;
}

// Grid: x = head group (pack heads), y = query tile counted from the sequence's last (every
// sequence's longest causal tiles first), z = sequence * splits + split.
template <int HD>
__device__ __forceinline__ CtaWork MakeCtaWork(const PrefillAttentionParams& p, int log2bs, int splits, int log2_pack) {
  return MakeWork<HD>(p, log2bs, splits, log2_pack, blockIdx.x, blockIdx.y, blockIdx.z);
}

// The work tiles of a launch with a one-dimensional grid, in one list (prefill_work_order.h:
// heaviest causal tiles first, in groups that keep the CTAs running at once on one sequence's
// keys and values).
struct WorkList {
  PrefillWorkOrder order;
  int log2bs, splits, log2_pack;  // what MakeWork needs besides the coordinates
};

// The work tile at list index `index` (< list.order.count).
template <int HD>
__device__ __forceinline__ CtaWork WorkAt(const PrefillAttentionParams& p, const WorkList& list, int index) {
  const PrefillWorkCoords c = PrefillWorkAt(list.order, index);
  return MakeWork<HD>(p, list.log2bs, list.splits, list.log2_pack, c.hx, c.from_last, c.sz);
}

// The first work tile with a query at list index >= *index among the CTA's (the index steps by
// gridDim.x): true with *index and *w set, false when the CTA has none left. Reads only the
// launch's tables (query_offsets, query_pos0), so it may run before WaitForPriorGrid.
template <int HD>
__device__ __forceinline__ bool NextWork(const PrefillAttentionParams& p, const WorkList& list, int* index,
                                         CtaWork* w) {
  for (; *index < list.order.count; *index += gridDim.x) {
    *w = WorkAt<HD>(p, list, *index);
    // The same in every lane; reduced so that the compiler knows the loop's exit is
    // warp-uniform (the persistent kernel's loops after it keep their uniform registers).
    if (__reduce_or_sync(0xffffffffu, w->active ? 1u : 0u) != 0) return true;
  }
  return false;
}

// Copies the CTA's raw fp32 query rows into shared memory (rows past the end zero-filled),
// by kCopyThreads threads (t).
template <int HD, int kCopyThreads>
__device__ __forceinline__ void LoadRawQuery(const CtaWork& w, uint32_t raw_smem, int t) {
  constexpr int kChunksPerRow = HD / 4;
  for (int i = t; i < kBM * kChunksPerRow; i += kCopyThreads) {
    const int r = i / kChunksPerRow, c = i % kChunksPerRow;
    const bool valid = r < w.rows;
    CpAsync16(raw_smem + RawQueryIndex<HD>(r, c * 4) * 4,
              valid ? w.q_tile + static_cast<size_t>(RowPair(w, r)) * HD + c * 4 : w.q_tile, valid ? 16 : 0);
  }
}

// One warp (all 32 lanes): the first entry in [lo, hi) whose logical start is past pos_hi, or
// hi (entries are in logical order, so "past" holds from some entry on). A 32-way search
// (entry_search.h): each round the lanes read 32 evenly spaced entries at once, so a table of up
// to 1024 entries costs two round trips to memory instead of a binary search's ten dependent
// ones (a short question over cached documents spent much of its prefill CTAs' time here).
__device__ __forceinline__ int FirstEntryPast(const PrefillAttentionParams& p, int lo, int hi, int pos_hi) {
  constexpr unsigned kAll = 0xffffffffu;
  const int lane = threadIdx.x & 31;
  EntrySearchRound round{lo, hi};
  for (;;) {
    const bool past = round.ProbeIsPast(lane, pos_hi, [&](int idx) { return __ldg(p.kv.block_starts + idx); });
    int answer = 0;
    if (round.Next(EntrySearchRound::FirstLane(__ballot_sync(kAll, past)), &answer)) return answer;
  }
}

// The block-table entries [*e_lo, *e_hi) of the CTA's split: the visible entries
// (start <= pos_hi) cut into `splits` parts. One warp, all 32 lanes (FirstEntryPast).
__device__ __forceinline__ void SplitEntryRange(const PrefillAttentionParams& p, const CtaWork& w, int* e_lo,
                                                int* e_hi) {
  *e_lo = p.kv.table_offsets[w.seq];
  *e_hi = p.kv.table_offsets[w.seq + 1];
  if (w.splits == 1) return;
  const int lo = FirstEntryPast(p, *e_lo, *e_hi, w.pos_hi);
  const int visible = lo - *e_lo, per = (visible + w.splits - 1) / w.splits;
  *e_hi = *e_lo + min(visible, (w.split + 1) * per);
  *e_lo = *e_lo + min(visible, w.split * per);
}

// One warp: the split's entry range and its first two tile descriptors (*first, *second),
// whose keys and values it then asks L2 for (unless !prefetch); returns the end of the range, which the warp needs
// for the later tiles. Reads only the launch's tables, so the kernels call it before they wait
// for the kernel before them (lazy_prefill_attention.h).
template <int HD>
__device__ __forceinline__ int MakeFirstTiles(const PrefillAttentionParams& p, const CtaWork& w, int log2bs,
                                              TileDesc* first, TileDesc* second, bool prefetch = true) {
  int e_lo = 0, e_hi = 0;
  SplitEntryRange(p, w, &e_lo, &e_hi);
  MakeTile(p, e_lo, 0, e_hi, w.entries_per_tile, w.pos_lo, w.pos_hi, first);
  __syncwarp();  // lane 0 wrote the descriptor's scalars
  if (first->valid) {
    NextTile(p, *first, e_hi, w.entries_per_tile, w.pos_lo, w.pos_hi, second);
  } else if ((threadIdx.x & 31) == 0) {
    second->valid = 0;
  }
  __syncwarp();  // the lanes wrote the second descriptor's entries
  if (prefetch) {
    PrefetchTileToL2<HD>(p, *first, log2bs, w.kvh);
    PrefetchTileToL2<HD>(p, *second, log2bs, w.kvh);
  }
  return e_hi;
}

// No visible key: the reference's output is zero (a split's partial: empty).
template <int HD>
__device__ __forceinline__ void WriteEmptyRows(const PrefillAttentionParams& p, const CtaWork& w, int t, int threads) {
  for (int i = t; i < w.rows * HD; i += threads) {
    w.out_tile[static_cast<size_t>(RowPair(w, i / HD)) * HD * w.splits + i % HD] = 0.0f;
  }
  if (w.m_tile != nullptr) {
    const size_t l_offset = PrefillWorkspacePairs(p) * w.splits;
    for (int r = t; r < w.rows; r += threads) {
      const size_t state = static_cast<size_t>(RowPair(w, r)) * w.splits;
      w.m_tile[state] = -INFINITY;
      w.m_tile[l_offset + state] = 0.0f;
    }
  }
}

// WriteEmptyRows in bf16 (unsplit, p.out_bf16).
template <int HD>
__device__ __forceinline__ void WriteEmptyRowsBf16(const PrefillAttentionParams& p, const CtaWork& w, int t,
                                                   int threads) {
  __nv_bfloat16* out = static_cast<__nv_bfloat16*>(p.out_bf16) + (w.out_tile - p.out);  // the tile's first row
  for (int i = t; i < w.rows * HD; i += threads) {
    out[static_cast<size_t>(RowPair(w, i / HD)) * HD + i % HD] = __float2bfloat16(0.0f);
  }
}

// A row's sum l from the parts its four threads hold (the m64nN accumulator's quad).
__device__ __forceinline__ float RowSum(float part) {
  part += __shfl_xor_sync(0xffffffffu, part, 1);
  return part + __shfl_xor_sync(0xffffffffu, part, 2);
}

// 1 / l, and 0 for a row that saw no key.
__device__ __forceinline__ float InverseSum(float sum) { return sum > 0.0f ? 1.0f / sum : 0.0f; }

// One thread's share of the output: rows my_row0 and my_row0 + 8 of the m64nHD accumulator
// (o), with the row's running max m (raw scores: scale_log2 turns it into log2 units) and
// this thread's part of its sum l.
template <int HD>
__device__ __forceinline__ void WriteRows(const PrefillAttentionParams& p, const CtaWork& w, const float (&o)[HD / 2],
                                          const float (&m)[2], const float (&l)[2], int my_row0, float scale_log2) {
  const int t4 = threadIdx.x % 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float sum = RowSum(l[h]);
    const float inv = w.splits > 1 ? 1.0f : InverseSum(sum);
    const int r = my_row0 + 8 * h;
    if (r < w.rows) {
      // RowPair times splits first (in int: under kBM * n_heads * kMaxSplits): other forms of
      // this index cost the specialized kernel register spills (ptxas -v).
      const int pair_splits = RowPair(w, r) * w.splits;
      float* dst = w.out_tile + static_cast<size_t>(pair_splits) * HD + 2 * t4;
#pragma unroll
      for (int n = 0; n < HD / 8; ++n) {
        *reinterpret_cast<float2*>(dst + n * 8) = make_float2(o[n * 4 + 2 * h] * inv, o[n * 4 + 2 * h + 1] * inv);
      }
      if (w.m_tile != nullptr && t4 == 0) {
        const size_t state = pair_splits;
        w.m_tile[state] = m[h] * scale_log2;  // log2 units: SoftmaxTile's l counts from m * scale_log2
        w.m_tile[PrefillWorkspacePairs(p) * w.splits + state] = sum;
      }
    }
  }
}

// WriteRows in bf16 (unsplit, p.out_bf16), straight from the registers (the one-tile kernel's:
// its CTA ends there, so nothing waits behind the stores): each value o / l rounded once, as
// LaunchToBf16 rounds WriteRows' fp32 values, so the two outputs agree bit for bit.
template <int HD>
__device__ __forceinline__ void WriteRowsBf16(const PrefillAttentionParams& p, const CtaWork& w,
                                              const float (&o)[HD / 2], const float (&l)[2], int my_row0) {
  const int t4 = threadIdx.x % 4;
  __nv_bfloat16* out = static_cast<__nv_bfloat16*>(p.out_bf16) + (w.out_tile - p.out);  // the tile's first row
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float inv = InverseSum(RowSum(l[h]));
    const int r = my_row0 + 8 * h;
    if (r < w.rows) {
      __nv_bfloat16* dst = out + static_cast<size_t>(RowPair(w, r)) * HD + 2 * t4;
#pragma unroll
      for (int n = 0; n < HD / 8; ++n) {
        *reinterpret_cast<uint32_t*>(dst + n * 8) = PackBf16(o[n * 4 + 2 * h] * inv, o[n * 4 + 2 * h + 1] * inv);
      }
    }
  }
}

// WriteRows in bf16 (unsplit, p.out_bf16), the persistent kernel's first step: one thread's
// share of rows my_row0 and my_row0 + 8, rounded once to bf16 into the 128-row tile at `tile` in
// shared memory, laid out as wgmma's query tiles (SwizzledOffset: 128-byte column blocks, 16-byte
// chunks XOR-swizzled by row), which is a TMA box's layout with a 128-byte swizzle. The 8 rows of
// a store instruction land in 8 different bank groups.
template <int HD>
__device__ __forceinline__ void StageRowsBf16(const float (&o)[HD / 2], const float (&l)[2], int my_row0,
                                              uint32_t tile) {
  const int t4 = threadIdx.x % 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float inv = InverseSum(RowSum(l[h]));
    const int row = my_row0 + 8 * h;  // columns 8 n + 2 t4 and + 1: chunk n, bytes 4 t4 .. 4 t4 + 3
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) {
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(tile + wgmma::SwizzledOffset<kBM>(row, n) + 4 * t4),
                   "r"(PackBf16(o[n * 4 + 2 * h] * inv, o[n * 4 + 2 * h + 1] * inv))
                   : "memory");
    }
  }
}

// WriteRows in bf16, second step where a TMA box would write rows past the tile's: `threads`
// threads (t) copy staged rows [row0, row0 + 64) that are the tile's (under w.rows) to
// p.out_bf16, 16 bytes a thread and store.
template <int HD>
__device__ __forceinline__ void StoreStagedRowsBf16(const PrefillAttentionParams& p, const CtaWork& w, int row0,
                                                    uint32_t tile, int t, int threads) {
  constexpr int kChunks = HD / 8;                                                       // 16-byte chunks of a bf16 row
  __nv_bfloat16* out = static_cast<__nv_bfloat16*>(p.out_bf16) + (w.out_tile - p.out);  // the tile's first row
  for (int i = t; i < 64 * kChunks; i += threads) {
    const int r = row0 + i / kChunks, chunk = i % kChunks;
    if (r >= w.rows) break;  // rows in order: the rest are past too
    uint4 v;
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(tile + wgmma::SwizzledOffset<kBM>(r, chunk))
                 : "memory");
    *reinterpret_cast<uint4*>(out + static_cast<size_t>(RowPair(w, r)) * HD + 8 * chunk) = v;
  }
}

}  // namespace
}  // namespace lazykv::cuda
