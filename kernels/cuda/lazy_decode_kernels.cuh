// The lazy paged decode kernel (one split of the block table per CTA; the combine of splits is
// split_combine.h's), included only by lazy_decode_attention.cu, which chooses configurations
// and launches it.
#pragma once

#include <cuda_bf16.h>

#include <cfloat>

#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/last_split_merge.cuh"
#include "kernels/cuda/lazy_decode_attention.h"
#include "kernels/cuda/lazy_decode_attention_config.h"
#include "kernels/cuda/rope_device.cuh"
#include "kernels/cuda/softmax_merge.cuh"

namespace lazykv::cuda {
namespace {

// Design (DESIGN.md section 2; figures in bench/results/cuda_decode_2026-11-21.md):
// - One CTA per (sequence, KV head, split): K and V of a KV head are read once for all the
//   query heads of its GQA group, held in registers as GP (the group rounded up to a power
//   of two) rows of the rotated query.
// - Each warp owns a contiguous range of the split's block-table entries and walks it in
//   tiles of 16 tokens of one entry, streamed through its own cp.async pipeline of STAGES
//   shared-memory tiles (16-byte copies, zero-filled past the visible tokens). No CTA-wide
//   barrier inside the loop; each lane reads back exactly the 16-byte pieces it copied.
// - Per tile: each lane dots its 8 dimensions of every row it holds with each query head,
//   a butterfly reduce-scatter over the lanes of a row leaves every score complete on one
//   lane, the online softmax updates once per tile (exp2, the scale and log2(e) folded into
//   the query), and the probabilities go through shared memory to the lanes holding V.
// - The query is re-rotated by (position - delta) when a warp meets a new delta, which in a
//   contiguous range happens about once per document.
// - Warps merge through shared memory at the end (softmax_merge.cuh); with one split the CTA
//   writes the output, otherwise its partial state (split_combine.h's layout) for the combine,
//   or, given split counters, the last split of the (sequence, KV head) merges them
//   (last_split_merge.cuh).
constexpr int kMaxGroup = 8;  // query heads per KV head handled by one CTA
constexpr int kTile = 16;     // tokens per warp step (at most one entry's)
constexpr float kLog2e = 1.4426950408889634f;

using async_copy::CpAsync16;
using async_copy::CpAsyncCommit;
using async_copy::CpAsyncWait;

__device__ __forceinline__ void Bf16x8ToFloat(const uint4& u, float (&f)[8]) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

constexpr int Log2(int x) { return x <= 1 ? 0 : 1 + Log2(x / 2); }

// Reduce-scatter of COUNT values over the lanes that differ in bits MASK, MASK/2, ..., 1:
// each step halves the values a lane keeps (the lane with the bit set keeps the upper
// half); once one value is left the remaining steps all-reduce it.
template <int COUNT, int MASK>
__device__ __forceinline__ void ReduceScatter(float* v, int lane) {
  if constexpr (MASK >= 1) {
    if constexpr (COUNT > 1) {
      constexpr int H = COUNT / 2;
      const bool upper = (lane & MASK) != 0;
#pragma unroll
      for (int i = 0; i < H; ++i) {
        const float send = upper ? v[i] : v[i + H];
        const float keep = upper ? v[i + H] : v[i];
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, MASK);
      }
      ReduceScatter<H, MASK / 2>(v, lane);
    } else {
      v[0] += __shfl_xor_sync(0xffffffffu, v[0], MASK);
      ReduceScatter<1, MASK / 2>(v, lane);
    }
  }
}

template <int HD, int GP, int WARPS, int STAGES>
struct DecodeShape {
  static constexpr int kLanesPerRow = HD / 8;             // 16-byte pieces per K or V row
  static constexpr int kRowsPerLoad = 32 / kLanesPerRow;  // rows one warp instruction covers
  static constexpr int kRowsPerLane = kTile / kRowsPerLoad;
  static constexpr int kScores = kRowsPerLane * GP;  // partial dots per lane per tile
  // After the reduce-scatter each lane owns kOwned complete scores: one row, heads
  // [(piece & 1) * kOwned, ...) when GP >= 2; with GP == 1 pairs of lanes hold duplicates.
  static constexpr int kOwned = kScores >= kLanesPerRow ? kScores / kLanesPerRow : 1;
  static constexpr int kDupShift = kScores >= kLanesPerRow ? 0 : Log2(kLanesPerRow) - Log2(kScores);
  static constexpr int kStageElems = 2 * kTile * HD;  // bf16: K rows, then V rows
  static constexpr size_t kStageBytes = static_cast<size_t>(WARPS) * STAGES * kStageElems * 2;
  static constexpr size_t kSmemBytes = kStageBytes + sizeof(float) * (GP * HD + WARPS * kTile * GP) +
                                       sizeof(int2) * WARPS * STAGES + sizeof(double) * HD / 2;
  static_assert(kOwned * 2 == GP || GP == 1, "ownership layout");
  static_assert(HD / 2 <= WARPS * 32, "one thread per inverse frequency");
  static_assert(sizeof(float) * WARPS * GP * (HD + 2) <= kStageBytes, "merge scratch fits the stages");
};

template <int N>
__device__ __forceinline__ void StoreFloats(float* dst, const float* v) {
  if constexpr (N == 4) {
    *reinterpret_cast<float4*>(dst) = make_float4(v[0], v[1], v[2], v[3]);
  } else if constexpr (N == 2) {
    *reinterpret_cast<float2*>(dst) = make_float2(v[0], v[1]);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) dst[i] = v[i];
  }
}

template <int N>
__device__ __forceinline__ void LoadFloats(const float* src, float* v) {
  if constexpr (N % 4 == 0) {
#pragma unroll
    for (int i = 0; i < N; i += 4) {
      const float4 x = *reinterpret_cast<const float4*>(src + i);
      v[i] = x.x;
      v[i + 1] = x.y;
      v[i + 2] = x.z;
      v[i + 3] = x.w;
    }
  } else if constexpr (N == 2) {
    const float2 x = *reinterpret_cast<const float2*>(src);
    v[0] = x.x;
    v[1] = x.y;
  } else {
    v[0] = src[0];
  }
}

// The new token's key (rotated to its position) and value for one KV head into its slot:
// LaunchKvWrite's arithmetic (kv_write.cu), by one warp.
template <int HD>
__device__ __forceinline__ void WriteNewToken(const DecodeAttentionParams& p, int seq, int kvh, int lane,
                                              size_t qkv_row) {
  const float* __restrict__ k = p.new_tokens.qkv + seq * qkv_row + static_cast<size_t>(p.n_heads) * HD + kvh * HD;
  const float* __restrict__ v = k + static_cast<size_t>(p.kv.n_kv_heads) * HD;
  const size_t slot =
      (static_cast<size_t>(p.new_tokens.slot_blocks[seq]) * p.kv.block_size + p.new_tokens.slot_index[seq]) *
          p.kv.n_kv_heads * HD +
      static_cast<size_t>(kvh) * HD;
  __nv_bfloat16* __restrict__ k_pool = static_cast<__nv_bfloat16*>(p.kv.k_pool) + slot;
  __nv_bfloat16* __restrict__ v_pool = static_cast<__nv_bfloat16*>(p.kv.v_pool) + slot;
  for (int i = lane; i < HD; i += 32) v_pool[i] = FromFloat<__nv_bfloat16>(v[i]);
  const long long position = p.new_tokens.rope_positions[seq];
  for (int i = lane; i < HD / 2; i += 32) {
    int a, b;
    RopePair(p.kv.rope_style, HD, i, &a, &b);
    float s, c;
    RopeSinCos(p.kv.inv_freq[i], position, &s, &c);
    StoreRotatedPair(k, a, b, s, c, k_pool);
  }
}

// One CTA: one sequence, one KV head (all its query heads), one split of the block table.
// Grid: x = (seq * splits + split) * n_kv_heads + kv_head, so that the KV heads of one
// sequence run side by side and read neighbouring bytes of the same blocks.
// MERGE_LAST: the launch has split counters and more than one split, so the last split of a
// (sequence, KV head) merges them. A separate instantiation: with the merge's code in it, the
// one-split kernel of a batch-64 step ran 1.37x slower on the H100 although it never reached
// that code (bench/results/shared_decode_2026-11-28.md).
template <int HD, int GP, int WARPS, int STAGES, bool MERGE_LAST = false>
__global__ void __launch_bounds__(WARPS * 32)
    DecodeSplitKernel(DecodeAttentionParams p, int splits, int entries_per_split) {
  using Shape = DecodeShape<HD, GP, WARPS, STAGES>;
  constexpr int kLanesPerRow = Shape::kLanesPerRow, kRowsPerLoad = Shape::kRowsPerLoad;
  constexpr int kRowsPerLane = Shape::kRowsPerLane, kScores = Shape::kScores, kOwned = Shape::kOwned;
  constexpr int kDupShift = Shape::kDupShift;
  constexpr unsigned kAll = 0xffffffffu;
  AllowDependentLaunch();  // launched by LaunchDependent (dependent_launch.cuh)
  WaitForPriorGrid();

  extern __shared__ __align__(16) unsigned char smem[];
  __nv_bfloat16* stage_base = reinterpret_cast<__nv_bfloat16*>(smem);
  float* q_raw = reinterpret_cast<float*>(smem + Shape::kStageBytes);        // [GP][HD]
  float* p_tiles = q_raw + GP * HD;                                          // [WARPS][kTile][GP]
  int2* stage_meta = reinterpret_cast<int2*>(p_tiles + WARPS * kTile * GP);  // [WARPS][STAGES]
  double* freq = reinterpret_cast<double*>(stage_meta + WARPS * STAGES);     // [HD / 2]

  int cta = blockIdx.x;
  const int kvh = cta % p.kv.n_kv_heads;
  cta /= p.kv.n_kv_heads;
  const int split = cta % splits;
  const int seq = cta / splits;
  const int group = p.n_heads / p.kv.n_kv_heads;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int piece = lane % kLanesPerRow;     // which 16 bytes (8 dimensions) of a row
  const int row_lane = lane / kLanesPerRow;  // which row of each load

  // Prologue: the raw query, the inverse frequencies and this warp's first window of the
  // block table are independent loads, all issued before the barrier that publishes them.
  constexpr int kQPerThread = (GP * HD + WARPS * 32 - 1) / (WARPS * 32);
  float q_load[kQPerThread];
  const bool new_tokens = p.new_tokens.qkv != nullptr;  // the KV write fused: q from the QKV rows
  const size_t qkv_row = static_cast<size_t>(p.n_heads + 2 * p.kv.n_kv_heads) * HD;
  const float* q_src = new_tokens ? p.new_tokens.qkv + seq * qkv_row + static_cast<size_t>(kvh) * group * HD
                                  : p.q + (static_cast<size_t>(seq) * p.n_heads + kvh * group) * HD;
#pragma unroll
  for (int r = 0; r < kQPerThread; ++r) {
    const int i = threadIdx.x + r * WARPS * 32;
    q_load[r] = i < group * HD ? q_src[i] : 0.0f;
  }
  const double freq_load = threadIdx.x < HD / 2 ? p.kv.inv_freq[threadIdx.x] : 0.0;
  const int seq_last = p.kv.table_offsets[seq + 1];
  const int first = min(seq_last, p.kv.table_offsets[seq] + split * entries_per_split);
  const int last = min(seq_last, first + entries_per_split);
  const int position = p.positions[seq];

  // This warp's entries: a contiguous range, so that it meets each document's delta once.
  const int per_warp = (last - first + WARPS - 1) / WARPS;
  const int warp_first = min(last, first + warp * per_warp);
  const int warp_last = min(last, warp_first + per_warp);

  // The load cursor walks the warp's entries through a window of 32 entries, one per lane.
  int window = warp_first, w_id = 0, w_vis = 0, w_delta = 0;
  unsigned w_valid = 0;
  auto fetch_window = [&]() {
    const int e = window + lane;
    w_id = 0;
    w_vis = 0;
    w_delta = 0;
    if (e < warp_last) {
      w_id = p.kv.block_ids[e];
      w_delta = p.kv.block_deltas[e];
      w_vis = min(p.kv.block_tokens[e], position - p.kv.block_starts[e] + 1);
    }
  };
  int cursor = -1, offset = 0;  // window slot of the next tile to load, and its first token
  auto seek = [&](int from) {   // the first entry with visible tokens at slot >= from
    for (;;) {
      const unsigned rest = from >= 32 ? 0u : (w_valid >> from) << from;
      if (rest != 0) {
        cursor = __ffs(rest) - 1;
        return;
      }
      window += 32;
      if (window >= warp_last) {
        cursor = -1;
        return;
      }
      fetch_window();
      w_valid = __ballot_sync(kAll, w_vis > 0);
      from = 0;
    }
  };
  if (warp_first < warp_last) fetch_window();

#pragma unroll
  for (int r = 0; r < kQPerThread; ++r) {
    const int i = threadIdx.x + r * WARPS * 32;
    if (i < GP * HD) q_raw[i] = q_load[r];
  }
  if (threadIdx.x < HD / 2) freq[threadIdx.x] = freq_load;
  __syncthreads();  // q_raw and freq are read-only from here on
  if (warp_first < warp_last) {
    w_valid = __ballot_sync(kAll, w_vis > 0);
    seek(0);
  }

  // The fused KV write: the warp whose range ends with the sequence's last entry (the one
  // holding the new token) writes this KV head's new key and value before it loads them.
  if (new_tokens && warp_first < warp_last && warp_last == seq_last) {
    WriteNewToken<HD>(p, seq, kvh, lane, qkv_row);
    __threadfence_block();  // the warp's own loads of the slot come after the stores
    __syncwarp();
  }

  const __nv_bfloat16* k_pool = static_cast<const __nv_bfloat16*>(p.kv.k_pool);
  const __nv_bfloat16* v_pool = static_cast<const __nv_bfloat16*>(p.kv.v_pool);
  const size_t row_stride = static_cast<size_t>(p.kv.n_kv_heads) * HD;
  __nv_bfloat16* warp_stages = stage_base + static_cast<size_t>(warp) * STAGES * Shape::kStageElems;
  auto issue = [&](int stage) {
    const int id = __shfl_sync(kAll, w_id, cursor);
    const int vis = __shfl_sync(kAll, w_vis, cursor);
    const int delta = __shfl_sync(kAll, w_delta, cursor);
    const int rows = min(kTile, vis - offset);
    __nv_bfloat16* sk = warp_stages + stage * Shape::kStageElems;
    __nv_bfloat16* sv = sk + kTile * HD;
    const size_t base = ((static_cast<size_t>(id) * p.kv.block_size + offset) * p.kv.n_kv_heads + kvh) * HD + piece * 8;
#pragma unroll
    for (int j = 0; j < kRowsPerLane; ++j) {
      const int row = j * kRowsPerLoad + row_lane;
      const bool ok = row < rows;
      const size_t src = base + (ok ? row : 0) * row_stride;
      CpAsync16(sk + (j * 32 + lane) * 8, k_pool + src, ok ? 16 : 0);
      CpAsync16(sv + (j * 32 + lane) * 8, v_pool + src, ok ? 16 : 0);
    }
    if (lane == 0) stage_meta[warp * STAGES + stage] = make_int2(delta, rows);
    offset += kTile;
    if (offset >= vis) {
      offset = 0;
      seek(cursor + 1);
    }
  };

  float q[GP][8], acc[GP][8], m_run[GP], l_own[kOwned];
#pragma unroll
  for (int g = 0; g < GP; ++g) {
    m_run[g] = -INFINITY;
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[g][e] = 0.0f;
  }
#pragma unroll
  for (int i = 0; i < kOwned; ++i) l_own[i] = 0.0f;

  const float q_scale = rsqrtf(static_cast<float>(HD)) * kLog2e;
  auto rotate = [&](int delta) {
    // Each warp rotates its own registers from the raw query in shared memory.
    const long long pos = static_cast<long long>(position) - delta;
    float sn[8], cs[8];
    if (p.kv.rope_style == RopeStyle::kInterleaved) {  // interleaved pairs (2i, 2i + 1)
#pragma unroll
      for (int e = 0; e < 8; e += 2) {
        RopeSinCos(freq[piece * 4 + e / 2], pos, &sn[e], &cs[e]);
        sn[e + 1] = sn[e];
        cs[e + 1] = cs[e];
      }
#pragma unroll
      for (int g = 0; g < GP; ++g) {
        float x[8];
        LoadFloats<8>(q_raw + g * HD + piece * 8, x);
#pragma unroll
        for (int e = 0; e < 8; e += 2) {
          q[g][e] = (x[e] * cs[e] - x[e + 1] * sn[e]) * q_scale;
          q[g][e + 1] = (x[e + 1] * cs[e] + x[e] * sn[e]) * q_scale;
        }
      }
    } else {  // rotate-half pairs (i, i + HD / 2)
      const bool low = piece * 8 < HD / 2;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        RopeSinCos(freq[(piece * 8 + e) & (HD / 2 - 1)], pos, &sn[e], &cs[e]);
        if (low) sn[e] = -sn[e];
      }
#pragma unroll
      for (int g = 0; g < GP; ++g) {
        float x[8], y[8];
        LoadFloats<8>(q_raw + g * HD + piece * 8, x);
        LoadFloats<8>(q_raw + g * HD + ((piece * 8) ^ (HD / 2)), y);
#pragma unroll
        for (int e = 0; e < 8; ++e) q[g][e] = (x[e] * cs[e] + y[e] * sn[e]) * q_scale;
      }
    }
  };

  // The scores this lane owns after the reduce-scatter: row and first head.
  const int own = (piece >> kDupShift) * kOwned;
  const int own_row = (own / GP) * kRowsPerLoad + row_lane;
  const int own_head = own % GP;
  const bool upper_heads = GP > 1 && (piece & 1) != 0;
  float* p_tile = p_tiles + warp * kTile * GP;

  int issued = 0;
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (cursor >= 0) {
      issue(s);
      ++issued;
    }
    CpAsyncCommit();
  }
  bool rotated = false;
  int rotated_delta = 0;
  for (int step = 0; step < issued; ++step) {
    const int stage = step % STAGES;
    if (cursor >= 0) {
      issue((step + STAGES - 1) % STAGES);
      ++issued;
    }
    CpAsyncCommit();
    CpAsyncWait<STAGES - 1>();
    __syncwarp();
    const int2 meta = stage_meta[warp * STAGES + stage];
    if (!rotated || meta.x != rotated_delta) {
      rotate(meta.x);
      rotated = true;
      rotated_delta = meta.x;
    }
    const __nv_bfloat16* sk = warp_stages + stage * Shape::kStageElems;
    const __nv_bfloat16* sv = sk + kTile * HD;

    // Scores: partial dots over this lane's 8 dimensions, then completed by reduce-scatter.
    float s[kScores];
#pragma unroll
    for (int j = 0; j < kRowsPerLane; ++j) {
      float kf[8];
      Bf16x8ToFloat(*reinterpret_cast<const uint4*>(sk + (j * 32 + lane) * 8), kf);
#pragma unroll
      for (int g = 0; g < GP; ++g) {
        float dot = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; ++e) dot = fmaf(q[g][e], kf[e], dot);
        s[j * GP + g] = dot;
      }
    }
    ReduceScatter<kScores, kLanesPerRow / 2>(s, lane);

    // Online softmax, once per tile.
    const bool valid = own_row < meta.y;
    float tile_max[kOwned];
#pragma unroll
    for (int i = 0; i < kOwned; ++i) {
      if (!valid) s[i] = -INFINITY;
      tile_max[i] = s[i];
    }
#pragma unroll
    for (int mask = GP > 1 ? 2 : 1; mask < 32; mask *= 2) {
#pragma unroll
      for (int i = 0; i < kOwned; ++i) tile_max[i] = fmaxf(tile_max[i], __shfl_xor_sync(kAll, tile_max[i], mask));
    }
    float m_tile[GP];
    if constexpr (GP == 1) {
      m_tile[0] = tile_max[0];
    } else {
#pragma unroll
      for (int i = 0; i < kOwned; ++i) {
        const float other = __shfl_xor_sync(kAll, tile_max[i], 1);
        m_tile[i] = upper_heads ? other : tile_max[i];
        m_tile[kOwned + i] = upper_heads ? tile_max[i] : other;
      }
    }
    float corr[GP];
#pragma unroll
    for (int g = 0; g < GP; ++g) {
      const float m_new = fmaxf(m_run[g], m_tile[g]);
      corr[g] = exp2f(m_run[g] - m_new);
      m_run[g] = m_new;
    }
    float prob[kOwned];
#pragma unroll
    for (int i = 0; i < kOwned; ++i) {
      const float m_own = GP == 1 ? m_run[0] : (upper_heads ? m_run[(kOwned + i) % GP] : m_run[i]);
      const float c_own = GP == 1 ? corr[0] : (upper_heads ? corr[(kOwned + i) % GP] : corr[i]);
      prob[i] = exp2f(s[i] - m_own);
      l_own[i] = l_own[i] * c_own + prob[i];
    }
    StoreFloats<kOwned>(p_tile + own_row * GP + own_head, prob);
    __syncwarp();

    // Output: rescale, then add P V over this lane's rows and 8 dimensions.
#pragma unroll
    for (int g = 0; g < GP; ++g) {
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[g][e] *= corr[g];
    }
#pragma unroll
    for (int j = 0; j < kRowsPerLane; ++j) {
      float vf[8], pr[GP];
      Bf16x8ToFloat(*reinterpret_cast<const uint4*>(sv + (j * 32 + lane) * 8), vf);
      LoadFloats<GP>(p_tile + (j * kRowsPerLoad + row_lane) * GP, pr);
#pragma unroll
      for (int g = 0; g < GP; ++g) {
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[g][e] = fmaf(pr[g], vf[e], acc[g][e]);
      }
    }
    __syncwarp();  // the stage and p_tile are rewritten next
  }
  CpAsyncWait<0>();

  // Merge the rows of a warp, then the warps, then write the output or this split's partial.
#pragma unroll
  for (int mask = kLanesPerRow; mask < 32; mask *= 2) {
#pragma unroll
    for (int g = 0; g < GP; ++g) {
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[g][e] += __shfl_xor_sync(kAll, acc[g][e], mask);
    }
  }
#pragma unroll
  for (int i = 0; i < kOwned; ++i) {
    if (kDupShift > 0 && (piece & ((1 << kDupShift) - 1)) != 0) l_own[i] = 0.0f;
#pragma unroll
    for (int mask = GP > 1 ? 2 : 1; mask < 32; mask *= 2) l_own[i] += __shfl_xor_sync(kAll, l_own[i], mask);
  }
  __syncthreads();                                  // every warp is done with its stages: they become the merge scratch
  float* red_acc = reinterpret_cast<float*>(smem);  // [WARPS][GP][HD]
  float* red_m = red_acc + WARPS * GP * HD;         // [WARPS][GP]
  float* red_l = red_m + WARPS * GP;
  if (row_lane == 0) {
#pragma unroll
    for (int g = 0; g < GP; ++g) {
      StoreFloats<4>(red_acc + (warp * GP + g) * HD + piece * 8, acc[g]);
      StoreFloats<4>(red_acc + (warp * GP + g) * HD + piece * 8 + 4, acc[g] + 4);
    }
  }
  if (lane == 0) {
#pragma unroll
    for (int g = 0; g < GP; ++g) red_m[warp * GP + g] = m_run[g];
  }
  if (lane < (GP > 1 ? 2 : 1)) StoreFloats<kOwned>(red_l + warp * GP + lane * kOwned, l_own);
  __syncthreads();

  // The pairs are (sequence, head): the workspace holds num_seqs * n_heads of them.
  const SplitPartials<float> part = SplitPartialsIn(p.workspace, static_cast<size_t>(p.num_seqs) * p.n_heads, splits);
  for (int idx = threadIdx.x; idx < group * HD; idx += WARPS * 32) {
    const int g = idx / HD, d = idx % HD;
    const MergedState merged = MergeStates<WARPS>(red_m + g, red_l + g, red_acc + g * HD + d, GP, GP * HD);
    const size_t pair = static_cast<size_t>(seq) * p.n_heads + kvh * group + g;
    if (splits == 1) {
      p.out[pair * HD + d] = MergedOutput(merged.acc, merged.l);
    } else {
      const size_t i = SplitStateIndex(pair, split, splits);
      part.acc[i * HD + d] = merged.acc;
      if (d == 0) {
        part.m[i] = merged.m;
        part.l[i] = merged.l;
      }
    }
  }
  if constexpr (MERGE_LAST) {  // the launcher checked the scratch fits
    MergeSplitsIfLast<WARPS * 32>(p.workspace, static_cast<size_t>(p.num_seqs) * p.n_heads, splits,
                                  static_cast<size_t>(seq) * p.n_heads + kvh * group, group, HD, p.out,
                                  p.split_counters + seq * p.kv.n_kv_heads + kvh, reinterpret_cast<float*>(smem));
  }
}

}  // namespace
}  // namespace lazykv::cuda
