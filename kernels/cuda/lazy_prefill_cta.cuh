// What every lazy prefill CTA does around its main loop, whichever kernel runs it: which
// (head, query tile, sequence, split) it is, the block-table entries its split covers, and
// the output of its rows (normalized, or a split's unnormalized partial with (max, sum)).
// Included only by the prefill kernels.
#pragma once

#include <cfloat>
#include <cstddef>
#include <cstdint>

#include "kernels/cuda/lazy_prefill_attention.h"
#include "kernels/cuda/lazy_prefill_tiles.cuh"

namespace lazykv::cuda {
namespace {

struct CtaWork {
  bool active;  // the CTA's query tile holds at least one query
  int head, seq, split, splits;
  int rows;            // queries in the tile (up to kBM)
  int pos_lo, pos_hi;  // positions of its first and last query
  int kvh, entries_per_tile;
  size_t row_stride;  // floats between a head's consecutive query rows
  const float* q_tile;
  float* out_tile;  // [row][head][HD]: the output, or this split's partial
  float* ml_tile;   // [row][head][2]: a split's (max, sum); null when unsplit
};

// Grid: x = head, y = query tile (longest causal tiles first), z = sequence * splits + split.
template <int HD>
__device__ __forceinline__ CtaWork MakeCtaWork(const PrefillAttentionParams& p, int log2bs, int splits) {
  CtaWork w;
  w.head = blockIdx.x;
  const int tile = gridDim.y - 1 - blockIdx.y;
  w.seq = blockIdx.z / splits;
  w.split = blockIdx.z % splits;
  w.splits = splits;
  const int q_begin = p.query_offsets[w.seq];
  const int n_q = p.query_offsets[w.seq + 1] - q_begin;
  const int row0 = tile * kBM;
  w.active = row0 < n_q;
  w.rows = min(kBM, n_q - row0);
  w.pos_lo = p.query_pos0[w.seq] + row0;
  w.pos_hi = w.pos_lo + w.rows - 1;
  w.kvh = w.head / (p.n_heads / p.kv.n_kv_heads);
  w.entries_per_tile = p.kv.block_size >= kBN ? 1 : (kBN >> log2bs);
  w.row_stride = static_cast<size_t>(p.n_heads) * HD;
  const size_t out_index = static_cast<size_t>(q_begin + row0) * p.n_heads + w.head;  // (query row, head)
  w.q_tile = p.q + out_index * HD;
  // Splits write unnormalized O ([split][row][head][HD]) and (max, sum) ([split][row][head][2]).
  const size_t ws_pairs = static_cast<size_t>(p.num_seqs) * p.max_queries_per_seq * p.n_heads;
  w.out_tile = splits == 1 ? p.out + out_index * HD : p.workspace + (w.split * ws_pairs + out_index) * HD;
  w.ml_tile =
      splits == 1 ? nullptr : p.workspace + splits * ws_pairs * HD + (w.split * ws_pairs + out_index) * 2;
  return w;
}

// The block-table entries [*e_lo, *e_hi) of the CTA's split: the visible entries
// (start <= pos_hi, found by binary search) cut into `splits` parts.
__device__ __forceinline__ void SplitEntryRange(const PrefillAttentionParams& p, const CtaWork& w, int* e_lo,
                                                int* e_hi) {
  *e_lo = p.kv.table_offsets[w.seq];
  *e_hi = p.kv.table_offsets[w.seq + 1];
  if (w.splits == 1) return;
  int lo = *e_lo, hi = *e_hi;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (__ldg(p.kv.block_starts + mid) <= w.pos_hi) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  const int visible = lo - *e_lo, per = (visible + w.splits - 1) / w.splits;
  *e_hi = *e_lo + min(visible, (w.split + 1) * per);
  *e_lo = *e_lo + min(visible, w.split * per);
}

// One warp: the split's entry range and its first two tile descriptors (desc[0], desc[1]);
// returns the end of the range, which the warp needs for the later tiles.
__device__ __forceinline__ int MakeFirstTiles(const PrefillAttentionParams& p, const CtaWork& w, TileDesc* desc) {
  int e_lo = 0, e_hi = 0;
  SplitEntryRange(p, w, &e_lo, &e_hi);
  MakeTile(p, e_lo, 0, e_hi, w.entries_per_tile, w.pos_lo, w.pos_hi, &desc[0]);
  __syncwarp();  // lane 0 wrote the descriptor's scalars
  if (desc[0].valid) {
    NextTile(p, desc[0], e_hi, w.entries_per_tile, w.pos_lo, w.pos_hi, &desc[1]);
  } else {
    desc[1].valid = 0;
  }
  return e_hi;
}

// No visible key: the reference's output is zero (a split's partial: empty).
template <int HD>
__device__ __forceinline__ void WriteEmptyRows(const PrefillAttentionParams& p, const CtaWork& w, int t,
                                               int threads) {
  for (int i = t; i < w.rows * HD; i += threads) w.out_tile[(i / HD) * w.row_stride + i % HD] = 0.0f;
  if (w.ml_tile != nullptr) {
    for (int r = t; r < w.rows; r += threads) {
      w.ml_tile[r * 2 * static_cast<size_t>(p.n_heads)] = -INFINITY;
      w.ml_tile[r * 2 * static_cast<size_t>(p.n_heads) + 1] = 0.0f;
    }
  }
}

// One thread's share of the output: rows my_row0 and my_row0 + 8 of the m64nHD accumulator
// (o), with the row's running max m and this thread's part of its sum l.
template <int HD>
__device__ __forceinline__ void WriteRows(const PrefillAttentionParams& p, const CtaWork& w, const float (&o)[HD / 2],
                                          const float (&m)[2], const float (&l)[2], int my_row0) {
  const int t4 = threadIdx.x % 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float sum = l[h];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const float inv = w.splits > 1 ? 1.0f : (sum > 0.0f ? 1.0f / sum : 0.0f);
    const int r = my_row0 + 8 * h;
    if (r < w.rows) {
      float* dst = w.out_tile + static_cast<size_t>(r) * w.row_stride + 2 * t4;
#pragma unroll
      for (int n = 0; n < HD / 8; ++n) {
        *reinterpret_cast<float2*>(dst + n * 8) = make_float2(o[n * 4 + 2 * h] * inv, o[n * 4 + 2 * h + 1] * inv);
      }
      if (w.ml_tile != nullptr && t4 == 0) {
        w.ml_tile[r * 2 * static_cast<size_t>(p.n_heads)] = m[h];
        w.ml_tile[r * 2 * static_cast<size_t>(p.n_heads) + 1] = sum;
      }
    }
  }
}

}  // namespace
}  // namespace lazykv::cuda
