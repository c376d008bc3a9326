// The lazy paged prefill kernels (the tiled attention kernel and the combine of splits),
// included only by lazy_prefill_attention.cu, which launches them.
#pragma once

#include <cuda_bf16.h>

#include <cfloat>
#include <climits>
#include <cstdint>

#include "kernels/cuda/lazy_prefill_attention.h"
#include "kernels/cuda/rope_device.cuh"

namespace lazykv::cuda {
namespace {

// One CTA: 128 queries of one head (4 warps, 32 query rows each) against KV tiles of 64
// keys, double-buffered in shared memory through cp.async.
constexpr int kBM = 128;
constexpr int kBN = 64;
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kMaxEntriesPerTile = 4;  // kBN / 16: the smallest block size
constexpr int kDescSlots = 3;
constexpr int kMaxSplits = 16;

// A KV tile: up to kBN slots of consecutive block-table entries that share one delta.
// With block_size <= kBN the tile is ne whole entries (column c: entry c / block_size,
// slot c % block_size); with block_size > kBN it is slots [s0, s0 + kBN) of one entry.
struct TileDesc {
  long long base[kMaxEntriesPerTile];  // element offset of (entry's block, slot 0, this KV head, dim 0)
  int valid;
  int e;           // first entry (index into the concatenated table)
  int s0;          // first slot within entry e (block_size > kBN only)
  int ne;          // entries in the tile
  int delta;
  int needs_mask;  // some column is empty or not visible to the tile's first query
  int tok[kMaxEntriesPerTile];
  int start[kMaxEntriesPerTile];
};

template <int HD>
struct SmemLayout {
  static constexpr int kQBytes = kBM * HD * 2;
  static constexpr int kKvBytes = kBN * HD * 2;
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + kQBytes;                 // 2 stages
  static constexpr int kV = kK + 2 * kKvBytes;            // 2 stages
  static constexpr int kColPos = kV + 2 * kKvBytes;       // int [2][kBN]
  static constexpr int kDesc = kColPos + 2 * kBN * 4;     // TileDesc [kDescSlots]
  static constexpr int kBytes = kDesc + kDescSlots * static_cast<int>(sizeof(TileDesc));
};

// Rows of HD bf16 in 16-byte chunks; chunk c of row r lives at chunk c ^ (r & 7), so that
// the 8 rows an ldmatrix phase reads fall in 8 different bank groups.
template <int HD>
__device__ __forceinline__ uint32_t Swizzle(int row, int chunk) {
  return static_cast<uint32_t>(row * (HD * 2) + ((chunk ^ (row & 7)) << 4));
}

__device__ __forceinline__ uint32_t SmemAddr(const void* ptr) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

// 16 bytes global -> shared; src_bytes 0 fills zeros (empty slots must not feed NaN).
__device__ __forceinline__ void CpAsync16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void CpAsyncWaitAll() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// d += a * b: one m16n8k16 bf16 product with fp32 accumulation.
__device__ __forceinline__ void Mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// The tile that starts at entry e, slot s0 (run by one thread; reads the block table).
__device__ void MakeTile(const PrefillAttentionParams& p, int e, int s0, int e_end, int entries_per_tile,
                         int pos_lo, int pos_hi, int kvh, TileDesc* d) {
  if (e >= e_end) {
    d->valid = 0;
    return;
  }
  int dl[kMaxEntriesPerTile], tk[kMaxEntriesPerTile], st[kMaxEntriesPerTile], bl[kMaxEntriesPerTile];
#pragma unroll
  for (int k = 0; k < kMaxEntriesPerTile; ++k) {
    const int idx = min(e + k, e_end - 1);
    dl[k] = __ldg(p.block_deltas + idx);
    tk[k] = __ldg(p.block_tokens + idx);
    st[k] = __ldg(p.block_starts + idx);
    bl[k] = __ldg(p.block_ids + idx);
  }
  if (st[0] + s0 > pos_hi) {  // entries are in logical order: nothing further is visible
    d->valid = 0;
    return;
  }
  int ne = 1;
#pragma unroll
  for (int k = 1; k < kMaxEntriesPerTile; ++k) {
    if (k < entries_per_tile && ne == k && e + k < e_end && dl[k] == dl[0]) ne = k + 1;
  }
  bool full;
  int max_logical;
  if (entries_per_tile == 1) {  // block_size >= kBN
    full = s0 + kBN <= tk[0];
    max_logical = st[0] + min(tk[0], s0 + kBN) - 1;
  } else {
    full = ne == entries_per_tile;
    max_logical = st[0] + tk[0] - 1;
#pragma unroll
    for (int k = 0; k < kMaxEntriesPerTile; ++k) {
      if (k < ne) {
        full = full && tk[k] == p.block_size;
        max_logical = st[k] + tk[k] - 1;
      }
    }
  }
  d->valid = 1;
  d->e = e;
  d->s0 = s0;
  d->ne = ne;
  d->delta = dl[0];
  d->needs_mask = !full || max_logical > pos_lo;
#pragma unroll
  for (int k = 0; k < kMaxEntriesPerTile; ++k) {
    d->base[k] = (static_cast<long long>(bl[k]) * p.block_size * p.n_kv_heads + kvh) * p.head_dim;
    d->tok[k] = tk[k];
    d->start[k] = st[k];
  }
  // The block table is read a few entries per tile: pull the next lines into L1 early so
  // that this (single-thread, latency-bound) walk rarely waits on L2.
  const int ahead = min(e + 32, e_end - 1);
  asm volatile("prefetch.global.L1 [%0];" ::"l"(p.block_ids + ahead));
  asm volatile("prefetch.global.L1 [%0];" ::"l"(p.block_tokens + ahead));
  asm volatile("prefetch.global.L1 [%0];" ::"l"(p.block_starts + ahead));
  asm volatile("prefetch.global.L1 [%0];" ::"l"(p.block_deltas + ahead));
}

__device__ void NextTile(const PrefillAttentionParams& p, const TileDesc& cur, int e_end, int entries_per_tile,
                         int pos_lo, int pos_hi, int kvh, TileDesc* next) {
  const int e = cur.e, ne = cur.ne, s0 = cur.s0, tok0 = cur.tok[0];
  if (entries_per_tile == 1 && s0 + kBN < tok0) {
    MakeTile(p, e, s0 + kBN, e_end, entries_per_tile, pos_lo, pos_hi, kvh, next);
  } else {
    MakeTile(p, e + ne, 0, e_end, entries_per_tile, pos_lo, pos_hi, kvh, next);
  }
}

// Issues the cp.async copies of one KV tile (K and V) and writes each column's logical
// position (INT_MAX for an empty column) for the mask.
template <int HD>
__device__ __forceinline__ void LoadTile(const PrefillAttentionParams& p, const TileDesc& d, int log2bs,
                                         uint32_t k_smem, uint32_t v_smem, int* col_pos) {
  constexpr int kChunksPerRow = HD / 8;
  constexpr int kRowsPerPass = kThreads / kChunksPerRow;
  constexpr int kPasses = kBN / kRowsPerPass;
  const int t = threadIdx.x, ch = t % kChunksPerRow, r0 = t / kChunksPerRow;
  const int bs = p.block_size, s0 = d.s0, ne = d.ne;
  const __nv_bfloat16* k_pool = static_cast<const __nv_bfloat16*>(p.k_pool);
  const __nv_bfloat16* v_pool = static_cast<const __nv_bfloat16*>(p.v_pool);
#pragma unroll
  for (int i = 0; i < kPasses; ++i) {
    const int r = r0 + i * kRowsPerPass;
    const int idx = s0 + r;
    const int k = idx >> log2bs;  // < kMaxEntriesPerTile
    const int slot = idx & (bs - 1);
    const bool valid = k < ne && slot < d.tok[k];
    const long long offset = valid ? d.base[k] + static_cast<long long>(slot) * p.n_kv_heads * HD + ch * 8 : 0;
    const uint32_t so = Swizzle<HD>(r, ch);
    CpAsync16(k_smem + so, k_pool + offset, valid ? 16 : 0);
    CpAsync16(v_smem + so, v_pool + offset, valid ? 16 : 0);
    if (ch == 0) col_pos[r] = valid ? d.start[k] + slot : INT_MAX;
  }
}

// One warp writes its 32 query rows, rotated by R(position - delta), into the bf16 query
// tile. Each lane owns two frequencies and walks the rows: the angle of the first row is
// formed and reduced in double (exact at any position), later rows advance it by a
// rotation of the row step (fp32 complex products: error ~1e-6 rad after 32 steps, far
// under the bf16 rounding that follows). The raw rows come from global memory (L2) in
// batches of 16 rows in flight, so a rotation costs about two L2 round trips.
template <int HD>
__device__ __forceinline__ void RotateQuery(const PrefillAttentionParams& p, const float* q_row0, size_t row_stride,
                                            int valid_rows, long long angle_pos0, int first_row,
                                            unsigned char* q_smem) {
  constexpr int kHalf = HD / 2;
  constexpr int kLanesPerRow = HD / 4;
  constexpr int kRowsPerStep = 32 / kLanesPerRow;
  constexpr int kSteps = 32 / kRowsPerStep;
  constexpr int kBatch = kSteps < 16 ? kSteps : 16;
  const int lane = threadIdx.x & 31;
  const int f0 = 2 * (lane % kLanesPerRow);
  const int rsub = lane / kLanesPerRow;
  float c[2], s[2], cs[2], ss[2];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const double th = __ldg(p.inv_freq + f0 + j);
    RopeSinCos(th, angle_pos0 + rsub, &s[j], &c[j]);
    RopeSinCos(th, kRowsPerStep, &ss[j], &cs[j]);
  }
  const bool interleaved = p.rope_style == 0;
  // Interleaved: columns 2 f0 .. 2 f0 + 3 hold the pairs (u0, v0), (u1, v1).
  // Rotate-half: columns f0, f0 + 1 hold u0, u1 and f0 + half, f0 + half + 1 hold v0, v1.
  const int col_a = interleaved ? 2 * f0 : f0;
  const int col_b = f0 + kHalf;
#pragma unroll 1
  for (int b0 = 0; b0 < kSteps; b0 += kBatch) {
    float4 x[kBatch];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int r = rsub + (b0 + i) * kRowsPerStep;
      x[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (r < valid_rows) {
        const float* row = q_row0 + static_cast<size_t>(r) * row_stride;
        if (interleaved) {
          x[i] = __ldg(reinterpret_cast<const float4*>(row + col_a));
        } else {
          const float2 a = __ldg(reinterpret_cast<const float2*>(row + col_a));
          const float2 b = __ldg(reinterpret_cast<const float2*>(row + col_b));
          x[i] = make_float4(a.x, b.x, a.y, b.y);  // (u0, v0, u1, v1)
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const float u[2] = {x[i].x, x[i].z}, v[2] = {x[i].y, x[i].w};
      float ru[2], rv[2];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        ru[j] = u[j] * c[j] - v[j] * s[j];
        rv[j] = u[j] * s[j] + v[j] * c[j];
        const float cn = c[j] * cs[j] - s[j] * ss[j];
        s[j] = s[j] * cs[j] + c[j] * ss[j];
        c[j] = cn;
      }
      const int tr = first_row + rsub + (b0 + i) * kRowsPerStep;  // row within the CTA's tile
      if (interleaved) {  // 4 consecutive columns, inside one 16-byte chunk
        *reinterpret_cast<uint2*>(q_smem + Swizzle<HD>(tr, col_a / 8) + (col_a % 8) * 2) =
            make_uint2(PackBf16(ru[0], rv[0]), PackBf16(ru[1], rv[1]));
      } else {
        *reinterpret_cast<uint32_t*>(q_smem + Swizzle<HD>(tr, col_a / 8) + (col_a % 8) * 2) = PackBf16(ru[0], ru[1]);
        *reinterpret_cast<uint32_t*>(q_smem + Swizzle<HD>(tr, col_b / 8) + (col_b % 8) * 2) = PackBf16(rv[0], rv[1]);
      }
    }
  }
}

// One CTA: one head, one tile of 128 queries, one split of the visible block table
// (splits > 1 write unnormalized partials to the workspace for CombineSplitsKernel).
template <int HD>
__global__ void __launch_bounds__(kThreads, 2) LazyPrefillKernel(const PrefillAttentionParams p, int log2bs,
                                                                 float scale_log2, int splits) {
  using L = SmemLayout<HD>;
  constexpr int kDimTiles = HD / 8;  // n-tiles of the output
  extern __shared__ __align__(128) unsigned char smem[];
  const int head = blockIdx.x;
  const int tile = gridDim.y - 1 - blockIdx.y;  // longest (causal) tiles first
  const int seq = blockIdx.z / splits, split = blockIdx.z % splits;
  const int q_begin = p.query_offsets[seq];
  const int n_q = p.query_offsets[seq + 1] - q_begin;
  const int row0 = tile * kBM;
  if (row0 >= n_q) return;
  const int rows = min(kBM, n_q - row0);
  const int pos_lo = p.query_pos0[seq] + row0;
  const int pos_hi = pos_lo + rows - 1;
  const int kvh = head / (p.n_heads / p.n_kv_heads);
  const int entries_per_tile = p.block_size >= kBN ? 1 : (kBN >> log2bs);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t4 = lane % 4;

  TileDesc* desc = reinterpret_cast<TileDesc*>(smem + L::kDesc);
  int* col_pos = reinterpret_cast<int*>(smem + L::kColPos);
  const uint32_t q_smem = SmemAddr(smem + L::kQ);
  const uint32_t k_smem = SmemAddr(smem + L::kK);
  const uint32_t v_smem = SmemAddr(smem + L::kV);

  const size_t row_stride = static_cast<size_t>(p.n_heads) * HD;
  const size_t out_index = static_cast<size_t>(q_begin + row0) * p.n_heads + head;  // (query row, head)
  const float* q_tile = p.q + out_index * HD;
  // Splits write unnormalized O ([split][row][head][HD]) and (max, sum) ([split][row][head][2]).
  const size_t ws_pairs = static_cast<size_t>(p.num_seqs) * p.max_queries_per_seq * p.n_heads;
  float* out_tile = splits == 1 ? p.out + out_index * HD : p.workspace + (split * ws_pairs + out_index) * HD;
  float* ml_tile = splits == 1 ? nullptr : p.workspace + splits * ws_pairs * HD + (split * ws_pairs + out_index) * 2;

  // Only thread 0 walks the block table, so only it needs the split's entry range: the
  // visible entries (start <= pos_hi, found by binary search) cut into `splits` parts.
  int e_lo = p.table_offsets[seq], e_hi = p.table_offsets[seq + 1];
  if (threadIdx.x == 0) {
    if (splits > 1) {
      int lo = e_lo, hi = e_hi;
      while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (__ldg(p.block_starts + mid) <= pos_hi) {
          lo = mid + 1;
        } else {
          hi = mid;
        }
      }
      const int visible = lo - e_lo, per = (visible + splits - 1) / splits;
      e_hi = e_lo + min(visible, (split + 1) * per);
      e_lo = e_lo + min(visible, split * per);
    }
    MakeTile(p, e_lo, 0, e_hi, entries_per_tile, pos_lo, pos_hi, kvh, &desc[0]);
    if (desc[0].valid) {
      NextTile(p, desc[0], e_hi, entries_per_tile, pos_lo, pos_hi, kvh, &desc[1]);
    } else {
      desc[1].valid = 0;
    }
  }
  __syncthreads();
  if (!desc[0].valid) {  // no visible key: the reference's output is zero (a split's: empty)
    for (int i = threadIdx.x; i < rows * HD; i += kThreads) out_tile[(i / HD) * row_stride + i % HD] = 0.0f;
    if (ml_tile != nullptr) {
      for (int r = threadIdx.x; r < rows; r += kThreads) {
        ml_tile[r * 2 * static_cast<size_t>(p.n_heads)] = -INFINITY;
        ml_tile[r * 2 * static_cast<size_t>(p.n_heads) + 1] = 0.0f;
      }
    }
    return;
  }
  LoadTile<HD>(p, desc[0], log2bs, k_smem, v_smem, col_pos);
  CpAsyncCommit();

  float o[2][kDimTiles][4];
  float m[2][2], l[2][2];
  int row_pos[2][2];
#pragma unroll
  for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      m[mi][h] = -INFINITY;
      l[mi][h] = 0.0f;
      row_pos[mi][h] = pos_lo + warp * 32 + mi * 16 + g + h * 8;
    }
#pragma unroll
    for (int n = 0; n < kDimTiles; ++n) {
#pragma unroll
      for (int i = 0; i < 4; ++i) o[mi][n][i] = 0.0f;
    }
  }

  bool rotated = false;
  int rotated_delta = 0;
  for (int j = 0;; ++j) {
    CpAsyncWaitAll();
    __syncthreads();  // tile j is in stage j & 1; every warp is done with stage (j + 1) & 1
    const int stage = j & 1;
    const TileDesc& d = desc[j % kDescSlots];
    const TileDesc& dn = desc[(j + 1) % kDescSlots];
    const bool has_next = dn.valid;
    const int delta = d.delta;
    const bool needs_mask = d.needs_mask;

    // The query tile, rotated for this delta: each warp rewrites only its own rows. Its
    // loads go out before the next tile's copies, so they do not queue behind them.
    if (!rotated || delta != rotated_delta) {
      __syncwarp();
      RotateQuery<HD>(p, q_tile + static_cast<size_t>(warp) * 32 * row_stride, row_stride, rows - warp * 32,
                      static_cast<long long>(pos_lo) + warp * 32 - delta, warp * 32, smem + L::kQ);
      __syncwarp();
      rotated = true;
      rotated_delta = delta;
    }
    if (has_next) {
      LoadTile<HD>(p, dn, log2bs, k_smem + (stage ^ 1) * L::kKvBytes, v_smem + (stage ^ 1) * L::kKvBytes,
                   col_pos + (stage ^ 1) * kBN);
      CpAsyncCommit();
      if (threadIdx.x == 0) {
        NextTile(p, dn, e_hi, entries_per_tile, pos_lo, pos_hi, kvh, &desc[(j + 2) % kDescSlots]);
      }
    }

    // S = Q K^T for the warp's 32 rows and the tile's 64 keys.
    float s[2][8][4];
#pragma unroll
    for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
      for (int n = 0; n < 8; ++n) {
#pragma unroll
        for (int i = 0; i < 4; ++i) s[mi][n][i] = 0.0f;
      }
    }
    const uint32_t k_stage = k_smem + stage * L::kKvBytes;
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
      uint32_t a[2][4];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
        LdMatrixX4(a[mi], q_smem + Swizzle<HD>(warp * 32 + mi * 16 + (lane % 16), kk * 2 + lane / 16));
      }
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        uint32_t b[4];
        LdMatrixX4(b, k_stage + Swizzle<HD>(np * 16 + (lane % 8) + (lane / 16) * 8, kk * 2 + (lane / 8) % 2));
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
          Mma(s[mi][2 * np], a[mi], b[0], b[1]);
          Mma(s[mi][2 * np + 1], a[mi], b[2], b[3]);
        }
      }
    }

    if (needs_mask) {
      const int* cp = col_pos + stage * kBN;
#pragma unroll
      for (int n = 0; n < 8; ++n) {
        const int2 c2 = *reinterpret_cast<const int2*>(cp + n * 8 + 2 * t4);
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            if (c2.x > row_pos[mi][h]) s[mi][n][2 * h] = -INFINITY;
            if (c2.y > row_pos[mi][h]) s[mi][n][2 * h + 1] = -INFINITY;
          }
        }
      }
    }

    // Online softmax (base 2, the 1/sqrt(d) scale folded into scale_log2).
#pragma unroll
    for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float mx = -INFINITY;
#pragma unroll
        for (int n = 0; n < 8; ++n) mx = fmaxf(mx, fmaxf(s[mi][n][2 * h], s[mi][n][2 * h + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m[mi][h], mx);
        const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // a row with nothing visible yet
        const float corr = exp2f((m[mi][h] - m_use) * scale_log2);
        m[mi][h] = m_new;
        const float mb = m_use * scale_log2;
        float sum = 0.0f;
#pragma unroll
        for (int n = 0; n < 8; ++n) {
          s[mi][n][2 * h] = exp2f(fmaf(s[mi][n][2 * h], scale_log2, -mb));
          s[mi][n][2 * h + 1] = exp2f(fmaf(s[mi][n][2 * h + 1], scale_log2, -mb));
          sum += s[mi][n][2 * h] + s[mi][n][2 * h + 1];
        }
        l[mi][h] = l[mi][h] * corr + sum;
#pragma unroll
        for (int n = 0; n < kDimTiles; ++n) {
          o[mi][n][2 * h] *= corr;
          o[mi][n][2 * h + 1] *= corr;
        }
      }
    }

    // O += P V, P from the score registers (the m16n8 accumulator layout is the m16k16
    // operand layout), V^T fragments through ldmatrix.trans.
    uint32_t pa[2][4][4];
#pragma unroll
    for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        pa[mi][ks][0] = PackBf16(s[mi][2 * ks][0], s[mi][2 * ks][1]);
        pa[mi][ks][1] = PackBf16(s[mi][2 * ks][2], s[mi][2 * ks][3]);
        pa[mi][ks][2] = PackBf16(s[mi][2 * ks + 1][0], s[mi][2 * ks + 1][1]);
        pa[mi][ks][3] = PackBf16(s[mi][2 * ks + 1][2], s[mi][2 * ks + 1][3]);
      }
    }
    const uint32_t v_stage = v_smem + stage * L::kKvBytes;
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
#pragma unroll
      for (int dp = 0; dp < HD / 16; ++dp) {
        uint32_t b[4];
        LdMatrixX4Trans(b, v_stage + Swizzle<HD>(ks * 16 + (lane % 8) + ((lane / 8) % 2) * 8, dp * 2 + lane / 16));
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
          Mma(o[mi][2 * dp], pa[mi][ks], b[0], b[1]);
          Mma(o[mi][2 * dp + 1], pa[mi][ks], b[2], b[3]);
        }
      }
    }
    if (!has_next) break;
  }

#pragma unroll
  for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float sum = l[mi][h];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const float inv = splits > 1 ? 1.0f : (sum > 0.0f ? 1.0f / sum : 0.0f);
      const int r = warp * 32 + mi * 16 + g + h * 8;
      if (r < rows) {
        float* dst = out_tile + static_cast<size_t>(r) * row_stride + 2 * t4;
#pragma unroll
        for (int n = 0; n < kDimTiles; ++n) {
          *reinterpret_cast<float2*>(dst + n * 8) = make_float2(o[mi][n][2 * h] * inv, o[mi][n][2 * h + 1] * inv);
        }
        if (ml_tile != nullptr && t4 == 0) {
          ml_tile[r * 2 * static_cast<size_t>(p.n_heads)] = m[mi][h];
          ml_tile[r * 2 * static_cast<size_t>(p.n_heads) + 1] = sum;
        }
      }
    }
  }
}

// Merges the splits' partials: one warp per (query row, head).
template <int HD>
__global__ void CombineSplitsKernel(const PrefillAttentionParams p, int splits, float scale_log2) {
  constexpr int E = HD / 32;
  const int seq = blockIdx.y;
  const int q_begin = p.query_offsets[seq];
  const int n_q = p.query_offsets[seq + 1] - q_begin;
  const int flat = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int row = flat / p.n_heads, head = flat % p.n_heads;
  if (row >= n_q) return;
  const int lane = threadIdx.x % 32;
  const size_t ws_pairs = static_cast<size_t>(p.num_seqs) * p.max_queries_per_seq * p.n_heads;
  const size_t idx = static_cast<size_t>(q_begin + row) * p.n_heads + head;
  const float* ml = p.workspace + splits * ws_pairs * HD;
  float m_all = -INFINITY;
  for (int s = 0; s < splits; ++s) {
    if (ml[(s * ws_pairs + idx) * 2 + 1] > 0.0f) m_all = fmaxf(m_all, ml[(s * ws_pairs + idx) * 2]);
  }
  float acc[E] = {}, l_all = 0.0f;
  for (int s = 0; s < splits; ++s) {
    const float l_s = ml[(s * ws_pairs + idx) * 2 + 1];
    if (l_s <= 0.0f) continue;
    const float w = exp2f((ml[(s * ws_pairs + idx) * 2] - m_all) * scale_log2);
    l_all += w * l_s;
    const float* o_s = p.workspace + (s * ws_pairs + idx) * HD + lane * E;
#pragma unroll
    for (int e = 0; e < E; ++e) acc[e] += w * o_s[e];
  }
  const float inv = l_all > 0.0f ? 1.0f / l_all : 0.0f;
#pragma unroll
  for (int e = 0; e < E; ++e) p.out[idx * HD + lane * E + e] = acc[e] * inv;
}

}  // namespace
}  // namespace lazykv::cuda
