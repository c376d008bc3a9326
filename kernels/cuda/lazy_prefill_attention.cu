#include <cuda_bf16.h>

#include <atomic>
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

// A KV tile: up to kBN slots of consecutive block-table entries that share one delta.
// With block_size <= kBN the tile is ne whole entries (column c: entry c / block_size,
// slot c % block_size); with block_size > kBN it is slots [s0, s0 + kBN) of one entry.
struct TileDesc {
  int valid;
  int e;           // first entry (index into the concatenated table)
  int s0;          // first slot within entry e (block_size > kBN only)
  int ne;          // entries in the tile
  int delta;
  int needs_mask;  // some column is empty or not visible to the tile's first query
  int blk[kMaxEntriesPerTile];
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
                         int pos_lo, int pos_hi, TileDesc* d) {
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
    d->blk[k] = bl[k];
    d->tok[k] = tk[k];
    d->start[k] = st[k];
  }
}

__device__ void NextTile(const PrefillAttentionParams& p, const TileDesc& cur, int e_end, int entries_per_tile,
                         int pos_lo, int pos_hi, TileDesc* next) {
  const int e = cur.e, ne = cur.ne, s0 = cur.s0, tok0 = cur.tok[0];
  if (entries_per_tile == 1 && s0 + kBN < tok0) {
    MakeTile(p, e, s0 + kBN, e_end, entries_per_tile, pos_lo, pos_hi, next);
  } else {
    MakeTile(p, e + ne, 0, e_end, entries_per_tile, pos_lo, pos_hi, next);
  }
}

// Issues the cp.async copies of one KV tile (K and V) and writes each column's logical
// position (INT_MAX for an empty column) for the mask.
template <int HD>
__device__ __forceinline__ void LoadTile(const PrefillAttentionParams& p, const TileDesc& d, int kvh, int log2bs,
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
    const size_t offset =
        valid ? ((static_cast<size_t>(d.blk[k]) * bs + slot) * p.n_kv_heads + kvh) * HD + ch * 8 : 0;
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
// under the bf16 rounding that follows).
template <int HD>
__device__ __forceinline__ void RotateQuery(const PrefillAttentionParams& p, const float* q_row0, size_t row_stride,
                                            int valid_rows, long long angle_pos0, int first_row, uint32_t q_smem) {
  constexpr int kHalf = HD / 2;
  constexpr int kLanesPerRow = HD / 4;
  constexpr int kRowsPerStep = 32 / kLanesPerRow;
  constexpr int kSteps = 32 / kRowsPerStep;
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
#pragma unroll 4
  for (int step = 0; step < kSteps; ++step) {
    const int r = rsub + step * kRowsPerStep;
    // u[j], v[j]: the pair of frequency f0 + j.
    float u[2] = {0.0f, 0.0f}, v[2] = {0.0f, 0.0f};
    if (r < valid_rows) {
      const float* row = q_row0 + static_cast<size_t>(r) * row_stride;
      if (interleaved) {
        const float4 x = *reinterpret_cast<const float4*>(row + 2 * f0);
        u[0] = x.x;
        v[0] = x.y;
        u[1] = x.z;
        v[1] = x.w;
      } else {
        const float2 a = *reinterpret_cast<const float2*>(row + f0);
        const float2 b = *reinterpret_cast<const float2*>(row + f0 + kHalf);
        u[0] = a.x;
        u[1] = a.y;
        v[0] = b.x;
        v[1] = b.y;
      }
    }
    float ru[2], rv[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      ru[j] = u[j] * c[j] - v[j] * s[j];
      rv[j] = u[j] * s[j] + v[j] * c[j];
      const float cn = c[j] * cs[j] - s[j] * ss[j];
      s[j] = s[j] * cs[j] + c[j] * ss[j];
      c[j] = cn;
    }
    const int tr = first_row + r;  // row within the CTA's tile (for the swizzle)
    if (interleaved) {
      const int col = 2 * f0;  // 4 consecutive columns, inside one 16-byte chunk
      const uint2 packed = make_uint2(PackBf16(ru[0], rv[0]), PackBf16(ru[1], rv[1]));
      const uint32_t addr = q_smem + Swizzle<HD>(tr, col / 8) + (col % 8) * 2;
      asm volatile("st.shared.v2.b32 [%0], {%1, %2};\n" ::"r"(addr), "r"(packed.x), "r"(packed.y) : "memory");
    } else {
      const uint32_t a0 = q_smem + Swizzle<HD>(tr, f0 / 8) + (f0 % 8) * 2;
      const uint32_t a1 = q_smem + Swizzle<HD>(tr, (f0 + kHalf) / 8) + ((f0 + kHalf) % 8) * 2;
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(a0), "r"(PackBf16(ru[0], ru[1])) : "memory");
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(a1), "r"(PackBf16(rv[0], rv[1])) : "memory");
    }
  }
}

template <int HD>
__global__ void __launch_bounds__(kThreads, 2) LazyPrefillKernel(const PrefillAttentionParams p, int log2bs,
                                                                 float scale_log2) {
  using L = SmemLayout<HD>;
  constexpr int kDimTiles = HD / 8;  // n-tiles of the output
  extern __shared__ __align__(128) unsigned char smem[];
  const int head = blockIdx.x;
  const int tile = gridDim.y - 1 - blockIdx.y;  // longest (causal) tiles first
  const int seq = blockIdx.z;
  const int q_begin = p.query_offsets[seq];
  const int n_q = p.query_offsets[seq + 1] - q_begin;
  const int row0 = tile * kBM;
  if (row0 >= n_q) return;
  const int rows = min(kBM, n_q - row0);
  const int pos_lo = p.query_pos0[seq] + row0;
  const int pos_hi = pos_lo + rows - 1;
  const int kvh = head / (p.n_heads / p.n_kv_heads);
  const int e_begin = p.table_offsets[seq], e_end = p.table_offsets[seq + 1];
  const int entries_per_tile = p.block_size >= kBN ? 1 : (kBN >> log2bs);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t4 = lane % 4;

  TileDesc* desc = reinterpret_cast<TileDesc*>(smem + L::kDesc);
  int* col_pos = reinterpret_cast<int*>(smem + L::kColPos);
  const uint32_t q_smem = SmemAddr(smem + L::kQ);
  const uint32_t k_smem = SmemAddr(smem + L::kK);
  const uint32_t v_smem = SmemAddr(smem + L::kV);

  const size_t row_stride = static_cast<size_t>(p.n_heads) * HD;
  const float* q_tile = p.q + (static_cast<size_t>(q_begin + row0) * p.n_heads + head) * HD;
  float* out_tile = p.out + (static_cast<size_t>(q_begin + row0) * p.n_heads + head) * HD;

  if (threadIdx.x == 0) {
    MakeTile(p, e_begin, 0, e_end, entries_per_tile, pos_lo, pos_hi, &desc[0]);
    if (desc[0].valid) {
      NextTile(p, desc[0], e_end, entries_per_tile, pos_lo, pos_hi, &desc[1]);
    } else {
      desc[1].valid = 0;
    }
  }
  __syncthreads();
  if (!desc[0].valid) {  // no visible key: the reference's output is zero
    for (int i = threadIdx.x; i < rows * HD; i += kThreads) out_tile[(i / HD) * row_stride + i % HD] = 0.0f;
    return;
  }
  LoadTile<HD>(p, desc[0], kvh, log2bs, k_smem, v_smem, col_pos);
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
    if (has_next) {
      LoadTile<HD>(p, dn, kvh, log2bs, k_smem + (stage ^ 1) * L::kKvBytes, v_smem + (stage ^ 1) * L::kKvBytes,
                   col_pos + (stage ^ 1) * kBN);
      CpAsyncCommit();
      if (threadIdx.x == 0) {
        NextTile(p, dn, e_end, entries_per_tile, pos_lo, pos_hi, &desc[(j + 2) % kDescSlots]);
      }
    }
    const int delta = d.delta;
    const bool needs_mask = d.needs_mask;

    // The query tile, rotated for this delta: each warp rewrites only its own rows.
    if (!rotated || delta != rotated_delta) {
      __syncwarp();
      RotateQuery<HD>(p, q_tile + static_cast<size_t>(warp) * 32 * row_stride, row_stride, rows - warp * 32,
                      static_cast<long long>(pos_lo) + warp * 32 - delta, warp * 32, q_smem);
      __syncwarp();
      rotated = true;
      rotated_delta = delta;
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
      const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
      const int r = warp * 32 + mi * 16 + g + h * 8;
      if (r < rows) {
        float* dst = out_tile + static_cast<size_t>(r) * row_stride + 2 * t4;
#pragma unroll
        for (int n = 0; n < kDimTiles; ++n) {
          *reinterpret_cast<float2*>(dst + n * 8) = make_float2(o[mi][n][2 * h] * inv, o[mi][n][2 * h + 1] * inv);
        }
      }
    }
  }
}

// Raises the kernel's dynamic shared memory limit once per device.
template <int HD>
cudaError_t PrepareKernel() {
  constexpr int kMaxDevices = 64;
  static std::atomic<uint64_t> done{0};
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  const uint64_t bit = device < kMaxDevices ? (uint64_t{1} << device) : 0;
  if (bit != 0 && (done.load(std::memory_order_relaxed) & bit)) return cudaSuccess;
  err = cudaFuncSetAttribute(LazyPrefillKernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             SmemLayout<HD>::kBytes);
  if (err == cudaSuccess && bit != 0) done.fetch_or(bit, std::memory_order_relaxed);
  return err;
}

}  // namespace

cudaError_t LaunchLazyPrefillAttention(const PrefillAttentionParams& p, cudaStream_t stream) {
  const bool pow2_block = p.block_size >= 16 && (p.block_size & (p.block_size - 1)) == 0;
  if (p.num_seqs <= 0 || p.num_seqs > 65535 || p.n_heads <= 0 || p.n_heads > 65535 || p.n_kv_heads <= 0 ||
      p.n_heads % p.n_kv_heads != 0 || (p.head_dim != 64 && p.head_dim != 128) || !pow2_block ||
      (p.rope_style != 0 && p.rope_style != 1) || p.max_queries_per_seq < 0 ||
      (p.max_queries_per_seq + kBM - 1) / kBM > 65535) {
    return cudaErrorInvalidValue;
  }
  if (p.max_queries_per_seq == 0) return cudaSuccess;
  if (p.q == nullptr || p.k_pool == nullptr || p.v_pool == nullptr || p.block_ids == nullptr ||
      p.block_tokens == nullptr || p.block_deltas == nullptr || p.block_starts == nullptr ||
      p.table_offsets == nullptr || p.query_offsets == nullptr || p.query_pos0 == nullptr ||
      p.inv_freq == nullptr || p.out == nullptr) {
    return cudaErrorInvalidValue;
  }
  int log2bs = 0;
  while ((1 << log2bs) < p.block_size) ++log2bs;
  const float scale_log2 = 1.4426950408889634f / sqrtf(static_cast<float>(p.head_dim));
  const dim3 grid(p.n_heads, (p.max_queries_per_seq + kBM - 1) / kBM, p.num_seqs);
  cudaError_t err;
  if (p.head_dim == 64) {
    if ((err = PrepareKernel<64>()) != cudaSuccess) return err;
    LazyPrefillKernel<64><<<grid, kThreads, SmemLayout<64>::kBytes, stream>>>(p, log2bs, scale_log2);
  } else {
    if ((err = PrepareKernel<128>()) != cudaSuccess) return err;
    LazyPrefillKernel<128><<<grid, kThreads, SmemLayout<128>::kBytes, stream>>>(p, log2bs, scale_log2);
  }
  return cudaGetLastError();
}

}  // namespace lazykv::cuda
