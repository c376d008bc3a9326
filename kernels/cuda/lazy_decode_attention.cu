#include <cuda_bf16.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cfloat>

#include "kernels/cuda/lazy_decode_attention.h"
#include "kernels/cuda/lazy_decode_attention_config.h"
#include "kernels/cuda/rope_device.cuh"

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
// - Warps merge through shared memory at the end; with one split the CTA writes the output,
//   otherwise a partial (running max in log2 units, sum, unnormalized output) for the
//   combine kernel.
constexpr int kMaxGroup = 8;  // query heads per KV head handled by one CTA
constexpr int kTile = 16;     // tokens per warp step (at most one entry's)
constexpr float kLog2e = 1.4426950408889634f;

// Partial results of one split: running max (log2 units), running sum, unnormalized output.
struct PartialView {
  float* m;
  float* l;
  float* acc;
  __device__ size_t index(int seq, int head, int split, int n_heads, int splits) const {
    return (static_cast<size_t>(seq) * n_heads + head) * splits + split;
  }
};

__device__ PartialView Partials(float* workspace, int num_seqs, int n_heads, int splits) {
  const size_t n = static_cast<size_t>(num_seqs) * n_heads * splits;
  return PartialView{workspace, workspace + n, workspace + 2 * n};
}

// 16 bytes global -> shared; src_bytes 0 fills zeros (masked rows must not feed NaN).
__device__ __forceinline__ void CpAsync16(void* dst, const void* src, int src_bytes) {
  const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

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
  static constexpr int kLanesPerRow = HD / 8;              // 16-byte pieces per K or V row
  static constexpr int kRowsPerLoad = 32 / kLanesPerRow;   // rows one warp instruction covers
  static constexpr int kRowsPerLane = kTile / kRowsPerLoad;
  static constexpr int kScores = kRowsPerLane * GP;        // partial dots per lane per tile
  // After the reduce-scatter each lane owns kOwned complete scores: one row, heads
  // [(piece & 1) * kOwned, ...) when GP >= 2; with GP == 1 pairs of lanes hold duplicates.
  static constexpr int kOwned = kScores >= kLanesPerRow ? kScores / kLanesPerRow : 1;
  static constexpr int kDupShift = kScores >= kLanesPerRow ? 0 : Log2(kLanesPerRow) - Log2(kScores);
  static constexpr int kStageElems = 2 * kTile * HD;  // bf16: K rows, then V rows
  static constexpr size_t kStageBytes = static_cast<size_t>(WARPS) * STAGES * kStageElems * 2;
  static constexpr size_t kSmemBytes =
      kStageBytes + sizeof(float) * (GP * HD + WARPS * kTile * GP) + sizeof(int2) * WARPS * STAGES +
      sizeof(double) * HD / 2;
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

// One CTA: one sequence, one KV head (all its query heads), one split of the block table.
// Grid: x = (seq * splits + split) * n_kv_heads + kv_head, so that the KV heads of one
// sequence run side by side and read neighbouring bytes of the same blocks.
template <int HD, int GP, int WARPS, int STAGES>
__global__ void __launch_bounds__(WARPS * 32) DecodeSplitKernel(DecodeAttentionParams p, int splits,
                                                                 int entries_per_split) {
  using Shape = DecodeShape<HD, GP, WARPS, STAGES>;
  constexpr int kLanesPerRow = Shape::kLanesPerRow, kRowsPerLoad = Shape::kRowsPerLoad;
  constexpr int kRowsPerLane = Shape::kRowsPerLane, kScores = Shape::kScores, kOwned = Shape::kOwned;
  constexpr int kDupShift = Shape::kDupShift;
  constexpr unsigned kAll = 0xffffffffu;

  extern __shared__ __align__(16) unsigned char smem[];
  __nv_bfloat16* stage_base = reinterpret_cast<__nv_bfloat16*>(smem);
  float* q_raw = reinterpret_cast<float*>(smem + Shape::kStageBytes);  // [GP][HD]
  float* p_tiles = q_raw + GP * HD;                                     // [WARPS][kTile][GP]
  int2* stage_meta = reinterpret_cast<int2*>(p_tiles + WARPS * kTile * GP);  // [WARPS][STAGES]
  double* freq = reinterpret_cast<double*>(stage_meta + WARPS * STAGES);     // [HD / 2]

  int cta = blockIdx.x;
  const int kvh = cta % p.n_kv_heads;
  cta /= p.n_kv_heads;
  const int split = cta % splits;
  const int seq = cta / splits;
  const int group = p.n_heads / p.n_kv_heads;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int piece = lane % kLanesPerRow;     // which 16 bytes (8 dimensions) of a row
  const int row_lane = lane / kLanesPerRow;  // which row of each load

  // Prologue: the raw query, the inverse frequencies and this warp's first window of the
  // block table are independent loads, all issued before the barrier that publishes them.
  constexpr int kQPerThread = (GP * HD + WARPS * 32 - 1) / (WARPS * 32);
  float q_load[kQPerThread];
#pragma unroll
  for (int r = 0; r < kQPerThread; ++r) {
    const int i = threadIdx.x + r * WARPS * 32;
    q_load[r] = i < group * HD ? p.q[(static_cast<size_t>(seq) * p.n_heads + kvh * group) * HD + i] : 0.0f;
  }
  const double freq_load = threadIdx.x < HD / 2 ? p.inv_freq[threadIdx.x] : 0.0;
  const int seq_last = p.table_offsets[seq + 1];
  const int first = min(seq_last, p.table_offsets[seq] + split * entries_per_split);
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
      w_id = p.block_ids[e];
      w_delta = p.block_deltas[e];
      w_vis = min(p.block_tokens[e], position - p.block_starts[e] + 1);
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

  const __nv_bfloat16* k_pool = static_cast<const __nv_bfloat16*>(p.k_pool);
  const __nv_bfloat16* v_pool = static_cast<const __nv_bfloat16*>(p.v_pool);
  const size_t row_stride = static_cast<size_t>(p.n_kv_heads) * HD;
  __nv_bfloat16* warp_stages = stage_base + static_cast<size_t>(warp) * STAGES * Shape::kStageElems;
  auto issue = [&](int stage) {
    const int id = __shfl_sync(kAll, w_id, cursor);
    const int vis = __shfl_sync(kAll, w_vis, cursor);
    const int delta = __shfl_sync(kAll, w_delta, cursor);
    const int rows = min(kTile, vis - offset);
    __nv_bfloat16* sk = warp_stages + stage * Shape::kStageElems;
    __nv_bfloat16* sv = sk + kTile * HD;
    const size_t base = ((static_cast<size_t>(id) * p.block_size + offset) * p.n_kv_heads + kvh) * HD + piece * 8;
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
    if (p.rope_style == 0) {  // interleaved pairs (2i, 2i + 1)
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
  __syncthreads();  // every warp is done with its stages: they become the merge scratch
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

  const PartialView part = Partials(p.workspace, p.num_seqs, p.n_heads, splits);
  for (int idx = threadIdx.x; idx < group * HD; idx += WARPS * 32) {
    const int g = idx / HD, d = idx % HD;
    float m_all = -INFINITY;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) {
      if (red_l[w * GP + g] > 0.0f) m_all = fmaxf(m_all, red_m[w * GP + g]);
    }
    float l_all = 0.0f, a_all = 0.0f;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) {
      if (red_l[w * GP + g] > 0.0f) {
        const float f = exp2f(red_m[w * GP + g] - m_all);
        l_all += f * red_l[w * GP + g];
        a_all += f * red_acc[(w * GP + g) * HD + d];
      }
    }
    const int head = kvh * group + g;
    if (splits == 1) {
      p.out[(static_cast<size_t>(seq) * p.n_heads + head) * HD + d] = l_all > 0.0f ? a_all / l_all : 0.0f;
    } else {
      const size_t i = part.index(seq, head, split, p.n_heads, splits);
      part.acc[i * HD + d] = a_all;
      if (d == 0) {
        part.m[i] = m_all;
        part.l[i] = l_all;
      }
    }
  }
}

// One CTA per (sequence, query head): merges the splits. The split weights are formed once,
// in parallel, in shared memory (splits floats of dynamic shared memory); then each thread
// sums one dimension over the splits with independent loads.
constexpr int kCombineThreads = 128;

__device__ __forceinline__ float BlockReduce(float v, float* scratch, bool is_max) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int mask = 16; mask > 0; mask /= 2) {
    const float o = __shfl_xor_sync(0xffffffffu, v, mask);
    v = is_max ? fmaxf(v, o) : v + o;
  }
  __syncthreads();  // scratch may still be read from a previous reduction
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = scratch[0];
  for (int w = 1; w < kCombineThreads / 32; ++w) v = is_max ? fmaxf(v, scratch[w]) : v + scratch[w];
  return v;
}

__global__ void __launch_bounds__(kCombineThreads) CombineSplitsKernel(DecodeAttentionParams p, int splits) {
  extern __shared__ float weight[];  // [splits rounded up to a multiple of 4]
  __shared__ float scratch[kCombineThreads / 32];
  const int seq = blockIdx.x / p.n_heads, head = blockIdx.x % p.n_heads;
  const PartialView part = Partials(p.workspace, p.num_seqs, p.n_heads, splits);
  const size_t base = part.index(seq, head, 0, p.n_heads, splits);
  float m_local = -INFINITY;
  for (int s = threadIdx.x; s < splits; s += kCombineThreads) {
    const float l = part.l[base + s];
    weight[s] = l;
    if (l > 0.0f) m_local = fmaxf(m_local, part.m[base + s]);
  }
  const float m_all = BlockReduce(m_local, scratch, true);
  float l_local = 0.0f;
  for (int s = threadIdx.x; s < splits; s += kCombineThreads) {
    const float l = weight[s];
    const float w = l > 0.0f ? exp2f(part.m[base + s] - m_all) : 0.0f;
    weight[s] = w;
    l_local += w * l;
  }
  const float l_all = BlockReduce(l_local, scratch, false);  // its barriers publish weight[]
  for (int d = threadIdx.x; d < p.head_dim; d += kCombineThreads) {
    const float* acc = part.acc + base * p.head_dim + d;
    float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
    int s = 0;
    for (; s + 4 <= splits; s += 4) {
      a0 += weight[s] * acc[static_cast<size_t>(s) * p.head_dim];
      a1 += weight[s + 1] * acc[static_cast<size_t>(s + 1) * p.head_dim];
      a2 += weight[s + 2] * acc[static_cast<size_t>(s + 2) * p.head_dim];
      a3 += weight[s + 3] * acc[static_cast<size_t>(s + 3) * p.head_dim];
    }
    for (; s < splits; ++s) a0 += weight[s] * acc[static_cast<size_t>(s) * p.head_dim];
    const float a_all = (a0 + a1) + (a2 + a3);
    p.out[(static_cast<size_t>(seq) * p.n_heads + head) * p.head_dim + d] = l_all > 0.0f ? a_all / l_all : 0.0f;
  }
}

__global__ void MaterializeKernel(MaterializeParams p) {
  const int copy = blockIdx.x;
  const int src = p.src_blocks[copy], dst = p.dst_blocks[copy], n = p.num_tokens[copy], delta = p.deltas[copy];
  const int hd = p.head_dim, half = hd / 2;
  __nv_bfloat16* k = static_cast<__nv_bfloat16*>(p.k_pool);
  __nv_bfloat16* v = static_cast<__nv_bfloat16*>(p.v_pool);
  const size_t slot_width = static_cast<size_t>(p.n_kv_heads) * hd;
  const size_t src_base = static_cast<size_t>(src) * p.block_size * slot_width;
  const size_t dst_base = static_cast<size_t>(dst) * p.block_size * slot_width;
  for (int idx = threadIdx.x; idx < n * p.n_kv_heads * half; idx += blockDim.x) {
    const int i = idx % half, row = idx / half;  // row = slot * n_kv_heads + head
    int a, b;
    RopePair(p.rope_style, hd, i, &a, &b);
    float s, c;
    RopeSinCos(p.inv_freq[i], delta, &s, &c);
    const size_t r = static_cast<size_t>(row) * hd;
    const float x0 = __bfloat162float(k[src_base + r + a]), x1 = __bfloat162float(k[src_base + r + b]);
    k[dst_base + r + a] = __float2bfloat16(x0 * c - x1 * s);
    k[dst_base + r + b] = __float2bfloat16(x0 * s + x1 * c);
  }
  for (size_t idx = threadIdx.x; idx < static_cast<size_t>(n) * slot_width; idx += blockDim.x) {
    v[dst_base + idx] = v[src_base + idx];
  }
}

}  // namespace

namespace {

constexpr int kMaxDevices = 64;

// The SM count of each device, asked once: this runs per layer per decode step.
int MultiprocessorCount() {
  static std::array<std::atomic<int>, kMaxDevices> cached{};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) return 132;
  int sms = cached[device].load(std::memory_order_relaxed);
  if (sms == 0) {
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) sms = 132;
    cached[device].store(sms, std::memory_order_relaxed);
  }
  return sms;
}

}  // namespace

namespace {

int CurrentDevice() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) return -1;
  return device;
}

// One kernel instantiation: its CTAs per SM with the shared memory it needs (asked once
// per device, which also raises the kernel's dynamic shared-memory limit), and its launch.
template <int HD, int GP, int WARPS, int STAGES>
struct DecodeKernel {
  using Shape = DecodeShape<HD, GP, WARPS, STAGES>;
  static int Occupancy() {
    static std::array<std::atomic<int>, kMaxDevices> cached{};
    const int device = CurrentDevice();
    int occupancy = device >= 0 ? cached[device].load(std::memory_order_relaxed) : 0;
    if (occupancy == 0) {
      auto* kernel = &DecodeSplitKernel<HD, GP, WARPS, STAGES>;
      if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(Shape::kSmemBytes)) != cudaSuccess ||
          cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occupancy, kernel, WARPS * 32, Shape::kSmemBytes) !=
              cudaSuccess ||
          occupancy <= 0) {
        return 1;  // no device (or no room): the launch reports the error
      }
      if (device >= 0) cached[device].store(occupancy, std::memory_order_relaxed);
    }
    return occupancy;
  }
  static void Launch(const DecodeAttentionParams& p, int splits, int entries_per_split, cudaStream_t stream) {
    Occupancy();  // raises the shared-memory limit on this device if not done yet
    const unsigned ctas = static_cast<unsigned>(p.num_seqs) * splits * p.n_kv_heads;
    DecodeSplitKernel<HD, GP, WARPS, STAGES>
        <<<ctas, WARPS * 32, Shape::kSmemBytes, stream>>>(p, splits, entries_per_split);
  }
};

struct KernelEntry {
  int (*occupancy)();
  void (*launch)(const DecodeAttentionParams&, int, int, cudaStream_t);
};

template <int HD, int GP, int WARPS, int STAGES>
KernelEntry Entry() {
  return {&DecodeKernel<HD, GP, WARPS, STAGES>::Occupancy, &DecodeKernel<HD, GP, WARPS, STAGES>::Launch};
}

template <int HD, int WARPS, int STAGES>
KernelEntry EntryForGroup(int padded_group) {
  switch (padded_group) {
    case 1:
      return Entry<HD, 1, WARPS, STAGES>();
    case 2:
      return Entry<HD, 2, WARPS, STAGES>();
    case 4:
      return Entry<HD, 4, WARPS, STAGES>();
    default:
      return Entry<HD, 8, WARPS, STAGES>();
  }
}

// Index 0 is the default; the others exist at head dim 128 with groups of 3-4 (the
// benchmark's shape) for tuning.
constexpr detail::DecodeKernelConfig kConfigs[] = {{4, 3}, {4, 2}, {8, 2}, {4, 4}};
constexpr int kNumConfigs = sizeof(kConfigs) / sizeof(kConfigs[0]);

int ConfigIndex(detail::DecodeKernelConfig c) {
  for (int i = 0; i < kNumConfigs; ++i) {
    if (kConfigs[i].warps == c.warps && kConfigs[i].stages == c.stages) return i;
  }
  return 0;
}

KernelEntry SelectKernel(const DecodeAttentionParams& p, detail::DecodeKernelConfig config) {
  const int group = p.n_kv_heads > 0 ? p.n_heads / p.n_kv_heads : 1;
  const int padded = group <= 1 ? 1 : group <= 2 ? 2 : group <= 4 ? 4 : 8;
  if (p.head_dim == 64) return EntryForGroup<64, 4, 3>(padded);
  if (padded == 4) {
    switch (ConfigIndex(config)) {
      case 1:
        return Entry<128, 4, 4, 2>();
      case 2:
        return Entry<128, 4, 8, 2>();
      case 3:
        return Entry<128, 4, 4, 4>();
      default:
        break;
    }
  }
  return EntryForGroup<128, 4, 3>(padded);
}

// Splits. One CTA of the default configuration streams about a full SM's share of the
// bandwidth, so the time is modelled per SM: the entries of the busiest SM (CTAs spread
// evenly over the SMs), a fixed cost per round of resident CTAs (prologue latency, pipeline
// fill, merge), and for more than one split the combine launch plus a cost per split.
// Measured on the H100 (bench/results/cuda_decode_2026-11-21.md): batch 1 at 4k-32k is
// fastest at 16 splits (one CTA per SM); batch >= 32 at one split.
// Units: the time an SM takes to stream one entry of 16 tokens.
constexpr int kMaxSplits = 1024;

int PickSplits(const DecodeAttentionParams& p, int ctas_per_sm) {
  if (p.num_splits > 0) return std::min({p.num_splits, std::max(1, p.max_entries_per_seq), kMaxSplits});
  const long long sms = MultiprocessorCount();
  const long long slots = sms * std::max(1, ctas_per_sm);
  const long long base = std::max(1, p.num_seqs * p.n_kv_heads);
  const int entries = std::max(1, p.max_entries_per_seq);
  const int max_splits = std::max(1, std::min(256, (entries + 3) / 4));
  constexpr double kFixed = 6.0, kCombine = 6.0, kPerSplit = 0.25;
  int best = 1;
  double best_cost = 0.0;
  for (int s = 1; s <= max_splits; ++s) {
    const long long ctas = base * s;
    const double cost = static_cast<double>((ctas + sms - 1) / sms) * ((entries + s - 1) / s) +
                        kFixed * static_cast<double>((ctas + slots - 1) / slots) +
                        (s > 1 ? kCombine + kPerSplit * s : 0.0);
    if (s == 1 || cost < 0.97 * best_cost) {  // more splits only for a clear gain
      best = s;
      best_cost = cost;
    }
  }
  return best;
}

bool ValidShapes(const DecodeAttentionParams& p) {
  return p.num_seqs > 0 && p.n_kv_heads > 0 && p.n_heads > 0 && p.n_heads % p.n_kv_heads == 0 &&
         p.n_heads / p.n_kv_heads <= kMaxGroup && (p.head_dim == 64 || p.head_dim == 128) && p.block_size > 0 &&
         p.max_entries_per_seq >= 0;
}

}  // namespace

namespace detail {

DecodeKernelConfig DefaultDecodeConfig() { return kConfigs[0]; }
int NumDecodeConfigs() { return kNumConfigs; }
DecodeKernelConfig DecodeConfigAt(int index) { return kConfigs[index >= 0 && index < kNumConfigs ? index : 0]; }

int ChooseDecodeSplitsFor(const DecodeAttentionParams& p, DecodeKernelConfig config) {
  return PickSplits(p, SelectKernel(p, config).occupancy());
}

cudaError_t LaunchLazyDecodeAttentionWith(DecodeAttentionParams p, DecodeKernelConfig config, cudaStream_t stream) {
  if (!ValidShapes(p)) return cudaErrorInvalidValue;
  const KernelEntry kernel = SelectKernel(p, config);
  const int splits = PickSplits(p, kernel.occupancy());
  const int entries_per_split = std::max(1, (p.max_entries_per_seq + splits - 1) / splits);
  kernel.launch(p, splits, entries_per_split, stream);
  if (splits > 1) {
    // Weights padded to a multiple of 4: the compiler may read the tail of the unrolled
    // loop as one vector.
    const size_t weight_bytes = static_cast<size_t>((splits + 3) / 4) * 4 * sizeof(float);
    CombineSplitsKernel<<<p.num_seqs * p.n_heads, kCombineThreads, weight_bytes, stream>>>(p, splits);
  }
  return cudaGetLastError();
}

}  // namespace detail

int ChooseDecodeSplits(const DecodeAttentionParams& p) {
  return detail::ChooseDecodeSplitsFor(p, detail::DefaultDecodeConfig());
}

size_t DecodeWorkspaceBytes(const DecodeAttentionParams& p, int num_splits) {
  return static_cast<size_t>(p.num_seqs) * p.n_heads * num_splits * (p.head_dim + 2) * sizeof(float);
}

cudaError_t LaunchLazyDecodeAttention(DecodeAttentionParams p, cudaStream_t stream) {
  return detail::LaunchLazyDecodeAttentionWith(p, detail::DefaultDecodeConfig(), stream);
}

cudaError_t LaunchMaterialize(const MaterializeParams& p, cudaStream_t stream) {
  if (p.num_copies == 0) return cudaSuccess;
  if (p.num_copies < 0 || p.head_dim % 2 != 0 || p.block_size <= 0) return cudaErrorInvalidValue;
  MaterializeKernel<<<p.num_copies, 256, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace lazykv::cuda
