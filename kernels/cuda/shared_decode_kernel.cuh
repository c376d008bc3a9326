// The shared kernel of chunk-shared decode attention (shared_decode_attention.h), included only
// by shared_decode_attention.cu. It reuses the cp.async helpers of the per-sequence decode
// kernel (lazy_decode_kernels.cuh), whose split kernel the launcher also runs on the residual.
//
// One CTA per (work item, KV head), 4 warps:
// - The item's entries (at most kSharedMaxEntries) are one list of tokens; the CTA walks it in
//   tiles of kSTile tokens, each tile's K and V rows (one KV head) copied once into shared
//   memory by all 128 threads (cp.async, 16-byte pieces, zero-filled past the item's tokens)
//   through a pipeline of STAGES tiles with one CTA barrier per tile.
// - The query rows are (member, head of the GQA group): row r is member r / group, head
//   r % group, at most kSharedMaxRows = 64 rows, warp w owning rows [16w, 16w + 16). Each row
//   is rotated once, by its member's (position - delta) (the planner guarantees one delta per
//   member over the item), scaled by log2(e) / sqrt(head_dim), and rounded to bf16 (by the
//   PRECISION parameter: or split into bf16 hi + lo halves, hi = bf16(x), lo = bf16(x - hi)):
//   each lane loads and rotates exactly the elements of its mma A fragments, in registers (no
//   shared memory, no barrier).
// - Per tile a warp computes S = Q K^T with mma.sync m16n8k16 (bf16 in, fp32 accumulate; with
//   halves, hi and lo each against the same K fragment), masks tokens past the item, updates its
//   rows' online softmax (exp2), and adds P V, P as bf16 (or hi + lo), V fragments by
//   ldmatrix.trans.
// - At the end each valid row writes its partial state (m, l, unnormalized acc: the layout of
//   split_combine.h) to slot (pair, member's part) of the shared workspace.
// Shared-memory rows are padded by 16 bytes, so that the 8 rows an ldmatrix phase reads fall
// in distinct banks. Registers at head dim 128: 168 with one bf16 query (3 CTAs an SM, 8 bytes
// spilled), about 230 with the halves (2 CTAs an SM).
#pragma once

#include <cuda_bf16.h>

#include <cfloat>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/lazy_decode_kernels.cuh"
#include "kernels/cuda/mma_sync.cuh"
#include "kernels/cuda/rope_device.cuh"
#include "kernels/cuda/shared_decode_attention.h"
#include "kernels/cuda/softmax_merge.cuh"

namespace lazykv::cuda::shared_decode {

constexpr int kSTile = 32;  // tokens per pipeline stage
constexpr int kSWarps = 4;  // kSharedMaxRows / 16
constexpr int kSThreads = kSWarps * 32;
static_assert(kSWarps * 16 == kSharedMaxRows, "a warp per 16 rows");
static_assert(kSharedMaxEntries <= 64, "the entry scan covers two per lane");

template <int HD, int STAGES>
struct SharedShape {
  static constexpr int kStride = HD + 8;  // bf16 per shared-memory row
  static constexpr int kTileElems = kSTile * kStride;
  static constexpr size_t kStageBytes = 2 * kTileElems * sizeof(__nv_bfloat16);  // K, then V
  static constexpr size_t kSmemBytes = STAGES * kStageBytes + sizeof(double) * (HD / 2) +
                                       sizeof(long long) * kSharedMaxRows +  // member positions
                                       sizeof(int) * (2 * kSharedMaxRows + 2 * kSharedMaxEntries + 1);
  static constexpr int kPiecesPerRow = HD / 8;  // 16-byte pieces
  static constexpr int kPiecesPerThread = kSTile * kPiecesPerRow / kSThreads;
  static_assert(kPiecesPerThread * kSThreads == kSTile * kPiecesPerRow, "whole pieces per thread");
};

using mma::Ldmatrix4;
using mma::Ldmatrix4Trans;
using mma::Mma;
using mma::SmemAddr;

__device__ __forceinline__ uint32_t AsU32(__nv_bfloat162 v) { return *reinterpret_cast<uint32_t*>(&v); }

// What reaches the tensor cores (the kernel's PRECISION parameter): the rotated query and P
// both as bf16 hi + lo pairs (two products each, about 16 significant bits); the query as a pair
// and P as one bf16 (8 bits); or both as one bf16, FlashAttention's way and the lazy prefill
// kernel's (half the products of the first, and no lo fragments of the query in registers).
// P and V as fp16 (P to 11 bits, V converted in registers) was measured too and lost
// (bench/results/shared_decode_2026-11-27.md).
enum Precision : int { kQpHiLo = 0, kPBf16 = 1, kQpBf16 = 2 };

// Two floats as bf16 hi + lo pairs (x ~= hi + lo to about 16 significant bits).
__device__ __forceinline__ void SplitPair(float x0, float x1, uint32_t* hi, uint32_t* lo) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
  *hi = AsU32(h);
  *lo = AsU32(__floats2bfloat162_rn(x0 - __low2float(h), x1 - __high2float(h)));
}

// Grid: x = item * n_kv_heads + kv_head (an item's KV heads side by side: neighbouring bytes of
// the same blocks). `group` = n_heads / n_kv_heads. MIN_CTAS: the CTAs per SM the registers
// must allow (3 fits only where the query has no lo half). Where the query has a lo half, the
// scores of hi and lo keep separate accumulators (two dependency chains of half the length).
// When the rows fill at most two warps, the idle warps take half of each tile's tokens (warp w:
// rows of block w % blocks, tokens of half w / blocks, its own online softmax), the two halves
// merged through shared memory at the end. The alternatives measured in one run by
// shared_decode_bench (bench/results/shared_decode_2026-11-25.md, _2026-11-28.md): one score
// chain, no token halves, 3 CTAs an SM with the query's lo half (spilling) were each slower.
template <int HD, int STAGES, int MIN_CTAS, int PRECISION>
__global__ void __launch_bounds__(kSThreads, MIN_CTAS) SharedDecodeKernel(SharedDecodeParams p, int group) {
  using Shape = SharedShape<HD, STAGES>;
  constexpr int kStride = Shape::kStride, kTileElems = Shape::kTileElems;
  constexpr int kKSteps = HD / 16;
  constexpr float kQLog2e = 1.4426950408889634f;
  constexpr bool kQueryLo = PRECISION != kQpBf16, kPLo = PRECISION == kQpHiLo;

  extern __shared__ __align__(16) unsigned char smem[];
  __nv_bfloat16* stages = reinterpret_cast<__nv_bfloat16*>(smem);
  double* freq = reinterpret_cast<double*>(smem + STAGES * Shape::kStageBytes);  // [HD / 2]
  long long* m_pos = reinterpret_cast<long long*>(freq + HD / 2);                // [members]: position - delta
  int* m_seq = reinterpret_cast<int*>(m_pos + kSharedMaxRows);                   // [members]
  int* m_part = m_seq + kSharedMaxRows;                                          // [members]
  int* e_ids = m_part + kSharedMaxRows;                                          // [entries]
  int* e_cum = e_ids + kSharedMaxEntries;                                        // [entries + 1]: first token

  const PagedKv& kv = p.base.kv;
  const int n_kv = kv.n_kv_heads, n_heads = p.base.n_heads;
  const int kvh = blockIdx.x % n_kv;
  const SharedWorkItem item = p.items[blockIdx.x / n_kv];
  const int num_entries = min(item.num_entries, kSharedMaxEntries);
  const int num_members = min(item.num_members, kSharedMaxRows / group);
  const int rows = num_members * group;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;

  // Prologue: the item's blocks and token offsets (a scan over two entries per lane), its
  // members and the inverse frequencies.
  if (warp == 0) {
    int t0 = lane < num_entries ? kv.block_tokens[item.entry_first + lane] : 0;
    int t1 = lane + 32 < num_entries ? kv.block_tokens[item.entry_first + lane + 32] : 0;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const int u0 = __shfl_up_sync(0xffffffffu, t0, d), u1 = __shfl_up_sync(0xffffffffu, t1, d);
      if (lane >= d) {
        t0 += u0;
        t1 += u1;
      }
    }
    const int first_half = __shfl_sync(0xffffffffu, t0, 31);
    if (lane == 0) e_cum[0] = 0;
    e_cum[lane + 1] = t0;
    if (lane + 33 <= kSharedMaxEntries) e_cum[lane + 33] = first_half + t1;
  } else if (warp == 1 || warp == 2) {
    const int e = tid - 32;  // 0..63
    if (e < num_entries) e_ids[e] = kv.block_ids[item.entry_first + e];
  } else {
    for (int m = lane; m < num_members; m += 32) {
      const SharedMember member = p.members[item.member_first + m];
      m_seq[m] = member.seq;
      m_part[m] = member.part;
      m_pos[m] = static_cast<long long>(member.position) - member.delta;
    }
  }
  if (tid < HD / 2) freq[tid] = kv.inv_freq[tid];
  __syncthreads();
  const int total = e_cum[num_entries];
  const int n_tiles = (total + kSTile - 1) / kSTile;
  // Every entry but the last full (the usual chunk): token f is in entry f / block_size.
  const bool full_blocks = num_entries > 0 && e_cum[num_entries - 1] == (num_entries - 1) * kv.block_size;

  const __nv_bfloat16* k_pool = static_cast<const __nv_bfloat16*>(kv.k_pool);
  const __nv_bfloat16* v_pool = static_cast<const __nv_bfloat16*>(kv.v_pool);
  auto issue = [&](int tile, int stage) {
    __nv_bfloat16* sk = stages + stage * 2 * kTileElems;
    __nv_bfloat16* sv = sk + kTileElems;
#pragma unroll
    for (int j = 0; j < Shape::kPiecesPerThread; ++j) {
      const int i = tid + j * kSThreads;
      const int row = i / Shape::kPiecesPerRow, piece = i % Shape::kPiecesPerRow;
      const int f = tile * kSTile + row;
      const bool ok = f < total;
      size_t src = 0;
      if (ok) {  // the entry holding token f: the last with e_cum[e] <= f
        int lo = full_blocks ? min(f / kv.block_size, num_entries - 1) : 0, hi = full_blocks ? lo : num_entries - 1;
        while (lo < hi) {
          const int mid = (lo + hi + 1) / 2;
          if (e_cum[mid] <= f) {
            lo = mid;
          } else {
            hi = mid - 1;
          }
        }
        const int slot = f - e_cum[lo];
        src = ((static_cast<size_t>(e_ids[lo]) * kv.block_size + slot) * n_kv + kvh) * HD + piece * 8;
      }
      CpAsync16(sk + row * kStride + piece * 8, k_pool + src, ok ? 16 : 0);
      CpAsync16(sv + row * kStride + piece * 8, v_pool + src, ok ? 16 : 0);
    }
  };
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < n_tiles) issue(s, s);
    CpAsyncCommit();
  }

  // The query rows straight into mma A fragments, while the tiles load: lane (g, t) of warp w
  // holds rows 16w + g and 16w + g + 8, dimensions 16ks + 2t, +1, +8, +9 of each k-step ks. Each
  // rotation pair lies within one lane (interleaved: neighbours; rotate-half: k-steps ks and
  // ks + HD / 32), so the raw values are loaded, rotated by (position - delta), scaled by
  // log2(e) / sqrt(head_dim) and rounded to bf16 (or split into bf16 hi + lo) in registers.
  // Padding rows are zero.
  const int g = lane / 4, t = lane % 4;  // the mma fragments' row group and column pair
  const int row_blocks = (rows + 15) / 16;
  const int halves = row_blocks <= 2 ? 2 : 1;                  // token halves of a tile (uniform)
  const int rb = halves == 2 ? warp % row_blocks : warp;       // this warp's block of 16 rows
  const int token_half = halves == 2 ? warp / row_blocks : 0;  // and its token half
  const bool active = rb * 16 < rows && token_half < halves;
  uint32_t qh[kKSteps][4];
  [[maybe_unused]] uint32_t ql[kQueryLo ? kKSteps : 1][4];  // only with kQueryLo
  if (active) {
    float x[2][kKSteps][4];
    long long pos[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = rb * 16 + g + 8 * h;
      pos[h] = 0;
      if (r < rows) {
        const int m = r / group;
        pos[h] = m_pos[m];
        const float* q = p.base.q + (static_cast<size_t>(m_seq[m]) * n_heads + kvh * group + r % group) * HD + 2 * t;
#pragma unroll
        for (int ks = 0; ks < kKSteps; ++ks) {
          const float2 lo = *reinterpret_cast<const float2*>(q + ks * 16);
          const float2 hi = *reinterpret_cast<const float2*>(q + ks * 16 + 8);
          x[h][ks][0] = lo.x;
          x[h][ks][1] = lo.y;
          x[h][ks][2] = hi.x;
          x[h][ks][3] = hi.y;
        }
      } else {
#pragma unroll
        for (int ks = 0; ks < kKSteps; ++ks) x[h][ks][0] = x[h][ks][1] = x[h][ks][2] = x[h][ks][3] = 0.0f;
      }
    }
    const float q_scale = rsqrtf(static_cast<float>(HD)) * kQLog2e;
    auto rotate = [&](float& a, float& b, int i, long long position) {
      float sn, cs;
      RopeSinCos(freq[i], position, &sn, &cs);
      const float xa = a, xb = b;
      a = (xa * cs - xb * sn) * q_scale;
      b = (xb * cs + xa * sn) * q_scale;
    };
    if (kv.rope_style == RopeStyle::kInterleaved) {  // pairs (2i, 2i + 1)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int ks = 0; ks < kKSteps; ++ks) {
          rotate(x[h][ks][0], x[h][ks][1], (ks * 16 + 2 * t) / 2, pos[h]);
          rotate(x[h][ks][2], x[h][ks][3], (ks * 16 + 2 * t + 8) / 2, pos[h]);
        }
      }
    } else {  // pairs (i, i + HD / 2)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int ks = 0; ks < kKSteps / 2; ++ks) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            rotate(x[h][ks][e], x[h][ks + kKSteps / 2][e], ks * 16 + 2 * t + (e & 1) + (e & 2) * 4, pos[h]);
          }
        }
      }
    }
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      if constexpr (kQueryLo) {
        SplitPair(x[0][ks][0], x[0][ks][1], &qh[ks][0], &ql[ks][0]);  // row g, columns 2t, 2t + 1
        SplitPair(x[1][ks][0], x[1][ks][1], &qh[ks][1], &ql[ks][1]);  // row g + 8
        SplitPair(x[0][ks][2], x[0][ks][3], &qh[ks][2], &ql[ks][2]);  // row g, columns 2t + 8, 2t + 9
        SplitPair(x[1][ks][2], x[1][ks][3], &qh[ks][3], &ql[ks][3]);  // row g + 8
      } else {
        qh[ks][0] = AsU32(__floats2bfloat162_rn(x[0][ks][0], x[0][ks][1]));
        qh[ks][1] = AsU32(__floats2bfloat162_rn(x[1][ks][0], x[1][ks][1]));
        qh[ks][2] = AsU32(__floats2bfloat162_rn(x[0][ks][2], x[0][ks][3]));
        qh[ks][3] = AsU32(__floats2bfloat162_rn(x[1][ks][2], x[1][ks][3]));
      }
    }
  }

  float o[HD / 8][4];
#pragma unroll
  for (int n = 0; n < HD / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};  // rows g, g + 8

  for (int tile = 0; tile < n_tiles; ++tile) {
    CpAsyncWait<STAGES - 2>();
    __syncthreads();  // tile `tile` is in; every warp is done with the stage refilled next
    if (tile + STAGES - 1 < n_tiles) issue(tile + STAGES - 1, (tile + STAGES - 1) % STAGES);
    CpAsyncCommit();
    if (!active) continue;
    const __nv_bfloat16* sk = stages + (tile % STAGES) * 2 * kTileElems;
    const __nv_bfloat16* sv = sk + kTileElems;

    // The tile's tokens [tok0, tok0 + 8 NT) for this warp: NT n-tiles of 8 tokens.
    auto process = [&](auto nt_constant, int tok0) {
      constexpr int NT = decltype(nt_constant)::value;
      // S = Q K^T: n-tile j holds tokens [tok0 + 8j, tok0 + 8j + 8) of the tile.
      float s[NT][4];
      [[maybe_unused]] float s_lo[kQueryLo ? NT : 1][4];  // only with the query's lo half
#pragma unroll
      for (int j = 0; j < NT; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
      if constexpr (kQueryLo) {
#pragma unroll
        for (int j = 0; j < NT; ++j) s_lo[j][0] = s_lo[j][1] = s_lo[j][2] = s_lo[j][3] = 0.0f;
      }
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks) {
#pragma unroll
        for (int hh = 0; hh < NT / 2; ++hh) {
          uint32_t kb[4];
          Ldmatrix4(kb, sk + (tok0 + 16 * hh + lane % 8 + (lane / 16) * 8) * kStride + ks * 16 + ((lane / 8) % 2) * 8);
          Mma(s[2 * hh], qh[ks], kb[0], kb[1]);
          Mma(s[2 * hh + 1], qh[ks], kb[2], kb[3]);
          if constexpr (kQueryLo) {  // the query's lo half, in its own accumulators
            Mma(s_lo[2 * hh], ql[ks], kb[0], kb[1]);
            Mma(s_lo[2 * hh + 1], ql[ks], kb[2], kb[3]);
          }
        }
      }
      if constexpr (kQueryLo) {
#pragma unroll
        for (int j = 0; j < NT; ++j) {
#pragma unroll
          for (int c = 0; c < 4; ++c) s[j][c] += s_lo[j][c];
        }
      }

      // Online softmax (tokens past the item masked), rows g and g + 8. A token half may be
      // wholly masked: its max then stays -inf and the exponents use 0 instead.
      float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int j = 0; j < NT; ++j) {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          if (tile * kSTile + tok0 + j * 8 + 2 * t + (c & 1) >= total) s[j][c] = -INFINITY;
          tile_max[c / 2] = fmaxf(tile_max[c / 2], s[j][c]);
        }
      }
      float corr[2], m_use[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 1));
        tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 2));
        const float m_new = fmaxf(m_run[h], tile_max[h]);
        m_use[h] = m_new == -INFINITY ? 0.0f : m_new;
        corr[h] = exp2f(m_run[h] - m_use[h]);
        m_run[h] = m_new;
        l_run[h] *= corr[h];
      }
#pragma unroll
      for (int j = 0; j < NT; ++j) {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          s[j][c] = exp2f(s[j][c] - m_use[c / 2]);
          l_run[c / 2] += s[j][c];
        }
      }
#pragma unroll
      for (int n = 0; n < HD / 8; ++n) {
        o[n][0] *= corr[0];
        o[n][1] *= corr[0];
        o[n][2] *= corr[1];
        o[n][3] *= corr[1];
      }

      // O += P V, 16 tokens per k-step.
#pragma unroll
      for (int kk = 0; kk < NT / 2; ++kk) {
        uint32_t ph[4];
        [[maybe_unused]] uint32_t pl[4];  // kPLo only
        if constexpr (kPLo) {
          SplitPair(s[2 * kk][0], s[2 * kk][1], &ph[0], &pl[0]);
          SplitPair(s[2 * kk][2], s[2 * kk][3], &ph[1], &pl[1]);
          SplitPair(s[2 * kk + 1][0], s[2 * kk + 1][1], &ph[2], &pl[2]);
          SplitPair(s[2 * kk + 1][2], s[2 * kk + 1][3], &ph[3], &pl[3]);
        } else {
          ph[0] = AsU32(__floats2bfloat162_rn(s[2 * kk][0], s[2 * kk][1]));
          ph[1] = AsU32(__floats2bfloat162_rn(s[2 * kk][2], s[2 * kk][3]));
          ph[2] = AsU32(__floats2bfloat162_rn(s[2 * kk + 1][0], s[2 * kk + 1][1]));
          ph[3] = AsU32(__floats2bfloat162_rn(s[2 * kk + 1][2], s[2 * kk + 1][3]));
        }
#pragma unroll
        for (int np = 0; np < HD / 16; ++np) {
          uint32_t vb[4];
          Ldmatrix4Trans(vb,
                         sv + (tok0 + 16 * kk + lane % 8 + ((lane / 8) % 2) * 8) * kStride + np * 16 + (lane / 16) * 8);
          if constexpr (kPLo) {
            Mma(o[2 * np], ph, vb[0], vb[1]);
            Mma(o[2 * np], pl, vb[0], vb[1]);
            Mma(o[2 * np + 1], ph, vb[2], vb[3]);
            Mma(o[2 * np + 1], pl, vb[2], vb[3]);
          } else {
            Mma(o[2 * np], ph, vb[0], vb[1]);
            Mma(o[2 * np + 1], ph, vb[2], vb[3]);
          }
        }
      }
    };
    if (halves == 2) {
      process(std::integral_constant<int, 2>{}, token_half * 16);
    } else {
      process(std::integral_constant<int, kSTile / 8>{}, 0);
    }
  }
  CpAsyncWait<0>();
#pragma unroll
  for (int h = 0; h < 2; ++h) {  // each row's sum over the lanes of its quad
    l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 1);
    l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 2);
  }
  if (halves == 2) {  // uniform over the CTA: the barriers are reached by every thread
    // The token halves merge: half 1 leaves its state in shared memory (the stages, now free),
    // half 0 folds it into its own. Scratch row r: HD accumulators, then m, then l.
    __syncthreads();  // every warp is done with the stages
    float* scratch = reinterpret_cast<float*>(smem);
    constexpr int kRow = HD + 2;
    if (active && token_half == 1) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float* row = scratch + (rb * 16 + g + 8 * h) * kRow;
#pragma unroll
        for (int n = 0; n < HD / 8; ++n) {
          row[n * 8 + 2 * t] = o[n][2 * h];
          row[n * 8 + 2 * t + 1] = o[n][2 * h + 1];
        }
        if (t == 0) {
          row[HD] = m_run[h];
          row[HD + 1] = l_run[h];
        }
      }
    }
    __syncthreads();
    if (active && token_half == 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float* row = scratch + (rb * 16 + g + 8 * h) * kRow;
        const float m0 = m_run[h], l0 = l_run[h], m1 = row[HD], l1 = row[HD + 1];
        float m = -INFINITY;
        m = MergeMax(m, &m0, l0);
        m = MergeMax(m, &m1, l1);
        const float w0 = MergeWeight(&m0, l0, m), w1 = MergeWeight(&m1, l1, m);
#pragma unroll
        for (int n = 0; n < HD / 8; ++n) {
          o[n][2 * h] = w0 * o[n][2 * h] + (w1 > 0.0f ? w1 * row[n * 8 + 2 * t] : 0.0f);
          o[n][2 * h + 1] = w0 * o[n][2 * h + 1] + (w1 > 0.0f ? w1 * row[n * 8 + 2 * t + 1] : 0.0f);
        }
        l_run[h] = w0 * l0 + w1 * l1;
        m_run[h] = m;
      }
    }
  }
  if (!active || token_half != 0) return;

  // Partial states: rows g and g + 8 of this warp's block, those that are real (member, head) rows.
  const size_t pairs = static_cast<size_t>(p.base.num_seqs) * n_heads;
  const SplitPartials<float> part = SplitPartialsIn(p.workspace, pairs, p.max_shared_parts);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = rb * 16 + g + 8 * h;
    if (r >= rows) continue;
    const int m = r / group;
    const size_t pair = static_cast<size_t>(m_seq[m]) * n_heads + kvh * group + r % group;
    const size_t state = SplitStateIndex(pair, m_part[m], p.max_shared_parts);
    float* acc = part.acc + state * HD + 2 * t;
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) {
      *reinterpret_cast<float2*>(acc + n * 8) = make_float2(o[n][2 * h], o[n][2 * h + 1]);
    }
    if (t == 0) {
      part.m[state] = m_run[h];
      part.l[state] = l_run[h];
    }
  }
}

}  // namespace lazykv::cuda::shared_decode
