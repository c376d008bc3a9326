// The lazy paged prefill kernels (the tiled attention kernel and the combine of splits),
// included only by lazy_prefill_attention.cu, which launches them.
//
// One CTA: 128 queries of one head, two warpgroups of 64 query rows each, against KV tiles
// of 128 keys double-buffered in shared memory through cp.async (all 256 threads copy).
// S = Q K^T and O += P V run on Hopper's warpgroup MMA (wgmma, kernels/cuda/wgmma.cuh):
// Q and K from shared memory, P from the score registers, V read transposed from the same
// layout as K. The query rows rotated by their positions, R(p) q, stay in shared memory as
// fp32: when the next KV tile has another delta d, each warp applies R(-d) to its 16 rows
// (one angle for all rows) while the tensor cores compute this tile's P V (which reads no
// query), so the rotation hides behind the MMA.
#pragma once

#include <cuda_bf16.h>

#include <cfloat>
#include <climits>
#include <cstdint>

#include "kernels/cuda/lazy_prefill_attention.h"
#include "kernels/cuda/lazy_prefill_tiles.cuh"
#include "kernels/cuda/rope_device.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace lazykv::cuda {
namespace {

// Copies the CTA's raw fp32 query rows into shared memory (rows past the end zero-filled).
template <int HD>
__device__ __forceinline__ void LoadRawQuery(const float* q_tile, size_t row_stride, int rows, uint32_t raw_smem) {
  constexpr int kChunksPerRow = HD / 4;
  for (int i = threadIdx.x; i < kBM * kChunksPerRow; i += kThreads) {
    const int r = i / kChunksPerRow, c = i % kChunksPerRow;
    const bool valid = r < rows;
    CpAsync16(raw_smem + i * 16, valid ? q_tile + static_cast<size_t>(r) * row_stride + c * 4 : q_tile, valid ? 16 : 0);
  }
}

// The lanes of a warp over its 16 query rows: each lane owns frequencies f0 and f0 + 1 of
// rows rsub, rsub + kRowsPerStep, ... Interleaved pairs: columns 2 f0 .. 2 f0 + 3 hold
// (u0, v0, u1, v1); rotate-half: columns f0, f0 + 1 hold u0, u1 and f0 + half, f0 + half + 1
// hold v0, v1.
template <int HD>
struct QueryLanes {
  static constexpr int kLanesPerRow = HD / 4;
  static constexpr int kRowsPerStep = 32 / kLanesPerRow;
  static constexpr int kSteps = kRowsPerWarp / kRowsPerStep;
  int f0, rsub, col_a, col_b;
  bool interleaved;
  __device__ explicit QueryLanes(int rope_style) {
    const int lane = threadIdx.x & 31;
    f0 = 2 * (lane % kLanesPerRow);
    rsub = lane / kLanesPerRow;
    interleaved = rope_style == 0;
    col_a = interleaved ? 2 * f0 : f0;
    col_b = f0 + HD / 2;
  }
  __device__ float4 Load(const float* row) const {  // (u0, v0, u1, v1)
    if (interleaved) return *reinterpret_cast<const float4*>(row + col_a);
    const float2 a = *reinterpret_cast<const float2*>(row + col_a);
    const float2 b = *reinterpret_cast<const float2*>(row + col_b);
    return make_float4(a.x, b.x, a.y, b.y);
  }
  __device__ void Store(float* row, float4 x) const {
    if (interleaved) {
      *reinterpret_cast<float4*>(row + col_a) = x;
    } else {
      *reinterpret_cast<float2*>(row + col_a) = make_float2(x.x, x.z);
      *reinterpret_cast<float2*>(row + col_b) = make_float2(x.y, x.w);
    }
  }
};

// (u + iv) (c + is) for both frequencies of a lane.
__device__ __forceinline__ float4 Rotate(float4 x, const float (&c)[2], const float (&s)[2]) {
  return make_float4(x.x * c[0] - x.y * s[0], x.x * s[0] + x.y * c[0], x.z * c[1] - x.w * s[1],
                     x.z * s[1] + x.w * c[1]);
}

// Once per CTA: one warp turns its 16 raw query rows (fp32, shared memory) into R(position) q
// in place. The angle of the first row is formed and reduced in double (exact at any
// position); later rows advance it by a rotation of the row step (fp32 complex products:
// error ~1e-6 rad after 16 steps, far under the bf16 rounding that comes later).
template <int HD>
__device__ __forceinline__ void RotateQueryByPosition(const PrefillAttentionParams& p, float* rows,
                                                      long long position0) {
  using Lanes = QueryLanes<HD>;
  const Lanes lanes(p.rope_style);
  float c[2], s[2], cs[2], ss[2];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const double th = __ldg(p.inv_freq + lanes.f0 + j);
    RopeSinCos(th, position0 + lanes.rsub, &s[j], &c[j]);
    RopeSinCos(th, Lanes::kRowsPerStep, &ss[j], &cs[j]);
  }
#pragma unroll 4
  for (int i = 0; i < Lanes::kSteps; ++i) {
    float* row = rows + (lanes.rsub + i * Lanes::kRowsPerStep) * HD;
    lanes.Store(row, Rotate(lanes.Load(row), c, s));
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const float cn = c[j] * cs[j] - s[j] * ss[j];
      s[j] = s[j] * cs[j] + c[j] * ss[j];
      c[j] = cn;
    }
  }
}

// One warp writes its 16 query rows for a tile of delta d: R(-d) applied to R(position) q
// (the same angle for every row, so one sine and cosine per frequency), rounded once to
// bf16 into the swizzled query tile that wgmma reads.
template <int HD>
__device__ __forceinline__ void RotateQueryByDelta(const PrefillAttentionParams& p, const float* rows, int delta,
                                                   int first_row, unsigned char* q_smem) {
  using Lanes = QueryLanes<HD>;
  const Lanes lanes(p.rope_style);
  float c[2], s[2];
#pragma unroll
  for (int j = 0; j < 2; ++j) RopeSinCos(__ldg(p.inv_freq + lanes.f0 + j), -static_cast<long long>(delta), &s[j], &c[j]);
#pragma unroll 4
  for (int i = 0; i < Lanes::kSteps; ++i) {
    const int r = lanes.rsub + i * Lanes::kRowsPerStep;
    const float4 y = Rotate(lanes.Load(rows + r * HD), c, s);
    const int tr = first_row + r;  // row within the CTA's tile
    if (lanes.interleaved) {  // 4 consecutive columns, inside one 16-byte chunk
      *reinterpret_cast<uint2*>(q_smem + wgmma::SwizzledOffset<kBM>(tr, lanes.col_a / 8) + (lanes.col_a % 8) * 2) =
          make_uint2(PackBf16(y.x, y.y), PackBf16(y.z, y.w));
    } else {
      *reinterpret_cast<uint32_t*>(q_smem + wgmma::SwizzledOffset<kBM>(tr, lanes.col_a / 8) + (lanes.col_a % 8) * 2) =
          PackBf16(y.x, y.z);
      *reinterpret_cast<uint32_t*>(q_smem + wgmma::SwizzledOffset<kBM>(tr, lanes.col_b / 8) + (lanes.col_b % 8) * 2) =
          PackBf16(y.y, y.w);
    }
  }
}

// Named barrier 1 between the two warpgroups (0 is __syncthreads).
__device__ __forceinline__ void WarpgroupsSync() { asm volatile("bar.sync 1, %0;\n" ::"n"(kThreads) : "memory"); }
__device__ __forceinline__ void WarpgroupsArrive() { asm volatile("bar.arrive 1, %0;\n" ::"n"(kThreads) : "memory"); }

// S = Q K^T for the warpgroup's 64 rows and the tile's 128 keys (issued, not waited for).
// A k16 step moves 32 bytes along a 128-byte swizzled row, or to the next 64-column
// block: only the descriptors' start-address field (bytes / 16, low bits) changes.
template <int HD>
__device__ __forceinline__ void IssueScores(float (&s)[kBN / 2], uint32_t q_rows, uint32_t k_stage) {
  const uint64_t a0 = wgmma::Descriptor(q_rows, 16, 1024);
  const uint64_t b0 = wgmma::Descriptor(k_stage, 16, 1024);
  wgmma::Fence();
#pragma unroll
  for (int ks = 0; ks < HD / 16; ++ks) {
    const uint32_t col = (ks % 4) * 32;  // k16 step within a 128-byte swizzled row
    wgmma::WgmmaSS_N128(s, a0 + (((ks / 4) * (kBM * 128) + col) >> 4), b0 + (((ks / 4) * (kBN * 128) + col) >> 4),
                        ks > 0 ? 1 : 0);
  }
  wgmma::Commit();
}

// O += P V: P (64 x 128 keys) from registers, V (128 keys x HD) read transposed.
template <int HD>
__device__ __forceinline__ void IssueValues(float (&o)[HD / 2], const uint32_t (&pa)[kBN / 16][4], uint32_t v_stage) {
  const uint64_t b0 = wgmma::Descriptor(v_stage, kBN * 128, 1024);
  wgmma::Fence();
#pragma unroll
  for (int kt = 0; kt < kBN / 16; ++kt) {
    const uint64_t b = b0 + ((kt * 16 * 128) >> 4);
    if constexpr (HD == 128) {
      wgmma::WgmmaRS_N128(o, pa[kt], b);
    } else {
      wgmma::WgmmaRS_N64(o, pa[kt], b);
    }
  }
  wgmma::Commit();
}

// Masks the scores of one tile, folds them into the running softmax (max m, sum l; O
// rescaled) and leaves the probabilities P as bf16 in the A-operand layout of m64nNk16 (per
// warp the m16n8 accumulator layout is the m16k16 operand layout): k-step kt covers keys
// 16 kt .. 16 kt + 15. Score element i: row my_row0 + 8 ((i / 2) % 2), column
// (i / 4) 8 + 2 t4 + i % 2.
template <int HD>
__device__ __forceinline__ void SoftmaxTile(float (&s)[kBN / 2], float (&o)[HD / 2], float (&m)[2], float (&l)[2],
                                            uint32_t (&pa)[kBN / 16][4], const int* cp, bool needs_mask,
                                            const int (&row_pos)[2], float scale_log2) {
  const int t4 = threadIdx.x % 4;
  if (needs_mask) {
#pragma unroll
    for (int n = 0; n < kBN / 8; ++n) {
      const int2 c2 = *reinterpret_cast<const int2*>(cp + n * 8 + 2 * t4);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (c2.x > row_pos[h]) s[n * 4 + 2 * h] = -INFINITY;
        if (c2.y > row_pos[h]) s[n * 4 + 2 * h + 1] = -INFINITY;
      }
    }
  }

  // Online softmax (base 2, the 1/sqrt(d) scale folded into scale_log2).
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float mx = -INFINITY;
#pragma unroll
    for (int n = 0; n < kBN / 8; ++n) mx = fmaxf(mx, fmaxf(s[n * 4 + 2 * h], s[n * 4 + 2 * h + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m[h], mx);
    const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // a row with nothing visible yet
    const float corr = exp2f((m[h] - m_use) * scale_log2);
    m[h] = m_new;
    const float mb = m_use * scale_log2;
    float sum = 0.0f;
#pragma unroll
    for (int n = 0; n < kBN / 8; ++n) {
      s[n * 4 + 2 * h] = exp2f(fmaf(s[n * 4 + 2 * h], scale_log2, -mb));
      s[n * 4 + 2 * h + 1] = exp2f(fmaf(s[n * 4 + 2 * h + 1], scale_log2, -mb));
      sum += s[n * 4 + 2 * h] + s[n * 4 + 2 * h + 1];
    }
    l[h] = l[h] * corr + sum;
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) {
      o[n * 4 + 2 * h] *= corr;
      o[n * 4 + 2 * h + 1] *= corr;
    }
  }

#pragma unroll
  for (int kt = 0; kt < kBN / 16; ++kt) {
    pa[kt][0] = PackBf16(s[8 * kt + 0], s[8 * kt + 1]);
    pa[kt][1] = PackBf16(s[8 * kt + 2], s[8 * kt + 3]);
    pa[kt][2] = PackBf16(s[8 * kt + 4], s[8 * kt + 5]);
    pa[kt][3] = PackBf16(s[8 * kt + 6], s[8 * kt + 7]);
  }
}

// One CTA: one head, one tile of 128 queries, one split of the visible block table
// (splits > 1 write unnormalized partials to the workspace for CombineSplitsKernel).
// Schedules of the main loop (the benchmark times them against each other): per tile,
// scores, softmax, P V, each waited for;
//  kSerial:  both warpgroups at once;
//  kStagger: warpgroup 1 issues its scores once warpgroup 0's are done, so that one
//            warpgroup's softmax runs while the other's products occupy the tensor cores
//            (1.05-1.10x kSerial on the H100).
// A third schedule, issuing the next tile's scores before this tile's softmax (as
// FlashAttention-3 does within a warpgroup), ran 1.2-1.3x slower than kStagger here at 253
// registers (bench/results/cuda_prefill_2026-11-21b.md) and was dropped.
enum Schedule { kSerial = 0, kStagger = 1 };
constexpr int kDefaultSchedule = kStagger;

template <int HD, int kSchedule>
__global__ void __launch_bounds__(kThreads, 1) LazyPrefillKernel(const PrefillAttentionParams p, int log2bs,
                                                                 float scale_log2, int splits) {
  using L = SmemLayout<HD>;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - (SmemAddr(smem_raw) & 1023)) & 1023);
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
  const int wg = warp / 4;
  const int g = lane / 4, t4 = lane % 4;
  const int my_row0 = warp * kRowsPerWarp + g;  // this thread's rows: my_row0 and my_row0 + 8

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

  // Only warp 0 walks the block table, so only it needs the split's entry range: the
  // visible entries (start <= pos_hi, found by binary search) cut into `splits` parts.
  int e_lo = p.table_offsets[seq], e_hi = p.table_offsets[seq + 1];
  if (warp == 0) {
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
    MakeTile(p, e_lo, 0, e_hi, entries_per_tile, pos_lo, pos_hi, &desc[0]);
    __syncwarp();  // lane 0 wrote the descriptor's scalars
    if (desc[0].valid) {
      NextTile(p, desc[0], e_hi, entries_per_tile, pos_lo, pos_hi, &desc[1]);
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
  LoadRawQuery<HD>(q_tile, row_stride, rows, SmemAddr(smem + L::kRawQ));
  CpAsyncCommit();
  LoadTile<HD>(p, desc[0], log2bs, kvh, k_smem, v_smem, col_pos);
  CpAsyncCommit();
  CpAsyncWait<1>();  // the raw query rows (the first tile may still be in flight)
  __syncthreads();
  // Each warp reads and rewrites only its own rows of the query: no barrier needed.
  float* q_rows_fp32 = reinterpret_cast<float*>(smem + L::kRawQ) + warp * kRowsPerWarp * HD;
  RotateQueryByPosition<HD>(p, q_rows_fp32, static_cast<long long>(pos_lo) + warp * kRowsPerWarp);
  __syncwarp();
  int q_delta = desc[0].delta;
  RotateQueryByDelta<HD>(p, q_rows_fp32, q_delta, warp * kRowsPerWarp, smem + L::kQ);
  wgmma::FenceProxyAsync();

  float o[HD / 2];
#pragma unroll
  for (int i = 0; i < HD / 2; ++i) o[i] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const int row_pos[2] = {pos_lo + my_row0, pos_lo + my_row0 + 8};

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
      LoadTile<HD>(p, dn, log2bs, kvh, k_smem + (stage ^ 1) * L::kKvBytes, v_smem + (stage ^ 1) * L::kKvBytes,
                   col_pos + (stage ^ 1) * kBN);
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
      NextTile(p, dn, e_hi, entries_per_tile, pos_lo, pos_hi, &desc[(j + 2) % kDescSlots]);
    }
    // While the tensor cores work (P V reads no query): the query rows for the next tile's
    // delta, if it differs. Every warp of this warpgroup has passed its wait on the scores
    // (they all issued P V), so no product reads the query buffer any more.
    if (has_next && next_delta != q_delta) {
      RotateQueryByDelta<HD>(p, q_rows_fp32, next_delta, warp * kRowsPerWarp, smem + L::kQ);
      wgmma::FenceProxyAsync();
      q_delta = next_delta;
    }
    wgmma::Wait<0>();
    wgmma::PinRegisters(o);
    if (!has_next) break;
  }

#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float sum = l[h];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const float inv = splits > 1 ? 1.0f : (sum > 0.0f ? 1.0f / sum : 0.0f);
    const int r = my_row0 + 8 * h;
    if (r < rows) {
      float* dst = out_tile + static_cast<size_t>(r) * row_stride + 2 * t4;
#pragma unroll
      for (int n = 0; n < HD / 8; ++n) {
        *reinterpret_cast<float2*>(dst + n * 8) = make_float2(o[n * 4 + 2 * h] * inv, o[n * 4 + 2 * h + 1] * inv);
      }
      if (ml_tile != nullptr && t4 == 0) {
        ml_tile[r * 2 * static_cast<size_t>(p.n_heads)] = m[h];
        ml_tile[r * 2 * static_cast<size_t>(p.n_heads) + 1] = sum;
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
