// The lazy prefill kernel's tiles: the CTA shape, the KV tile descriptor and the walk of the
// block table that builds it, the shared-memory layout, and the cp.async copy of a KV tile
// into wgmma's swizzled layout. Included only by the prefill kernel headers.
#pragma once

#include <cuda_bf16.h>

#include <climits>
#include <cstdint>

#include "kernels/cuda/lazy_prefill_attention.h"
#include "kernels/cuda/wgmma.cuh"

namespace lazykv::cuda {
namespace {

constexpr int kBM = 128;  // query rows per CTA
constexpr int kBN = 128;  // keys per KV tile
constexpr int kWarpgroups = 2;
constexpr int kThreads = kWarpgroups * 128;
constexpr int kRowsPerWarp = kBM / (kThreads / 32);  // 16: the query rows each warp rotates and owns
constexpr int kMaxEntriesPerTile = kBN / 16;         // 16: the smallest block size
constexpr int kDescSlots = 3;                        // tiles j, j + 1 and j + 2 (written during tile j)
constexpr int kMaxSplits = 16;

// The kernels and schedules of the main loop, timed against each other by the benchmark:
// kSerial and kStagger run the two-warpgroup kernel (lazy_prefill_kernels.cuh); kSpecialized
// the kernel with copy, rotation and consumer warpgroups (lazy_prefill_specialized.cuh), a CTA
// per work tile, and kPersistent the same kernel on a grid of one CTA an SM, each CTA taking
// many work tiles (the next one's loads and rotations overlap the end of the one before).
enum Schedule { kSerial = 0, kStagger = 1, kSpecialized = 2, kPersistent = 3 };

// A KV tile: up to kBN slots of consecutive block-table entries that share one delta.
// With block_size <= kBN the tile is ne whole entries (column c: entry c / block_size,
// slot c % block_size); with block_size > kBN it is slots [s0, s0 + kBN) of one entry.
struct TileDesc {
  int block[kMaxEntriesPerTile];  // each entry's pool block
  int valid;
  int e;   // first entry (index into the concatenated table)
  int s0;  // first slot within entry e (block_size > kBN only)
  int ne;  // entries in the tile
  int delta;
  int needs_mask;  // some column is empty or not visible to the tile's first query
  int tok[kMaxEntriesPerTile];
  int start[kMaxEntriesPerTile];
};

// Offsets from a 1024-byte aligned base (the swizzled tiles need it). The raw fp32 query
// tile stays in shared memory so that a rotation for a new delta reads no global memory.
template <int HD>
struct SmemLayout {
  static constexpr int kRawQBytes = kBM * HD * 4;
  static constexpr int kQBytes = kBM * HD * 2;
  static constexpr int kKvBytes = kBN * HD * 2;
  static constexpr int kRawQ = 0;                      // fp32 [kBM][HD], unrotated
  static constexpr int kQ = kRawQ + kRawQBytes;        // bf16, rotated, swizzled
  static constexpr int kK = kQ + kQBytes;              // 2 stages
  static constexpr int kV = kK + 2 * kKvBytes;         // 2 stages
  static constexpr int kColPos = kV + 2 * kKvBytes;    // int [2][kBN]
  static constexpr int kDesc = kColPos + 2 * kBN * 4;  // TileDesc [kDescSlots]
  static constexpr int kBytes = kDesc + kDescSlots * static_cast<int>(sizeof(TileDesc));
  static constexpr int kAllocBytes = kBytes + 1024;  // room to align the dynamic base
  static_assert(kAllocBytes <= 227 * 1024, "over the shared memory of one CTA on Hopper");
};

__device__ __forceinline__ uint32_t SmemAddr(const void* ptr) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

// 16 bytes global -> shared; src_bytes 0 fills zeros (empty slots must not feed NaN).
__device__ __forceinline__ void CpAsync16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// The fp32 query tile in shared memory, row-major [kBM][HD]. Its readers, QueryLanes and
// WriteQueryForDelta, take whole rows (WriteQueryForDelta offsets columns from a row's
// RawQueryIndex(r, 0), so it assumes the row-major layout too).
template <int HD>
__device__ __forceinline__ int RawQueryIndex(int row, int col) {
  return row * HD + col;
}

// The tile that starts at entry e, slot s0, built by one warp (all 32 lanes call it): lane
// k < kMaxEntriesPerTile reads entry e + k of the block table, so the walk costs one
// round trip to memory rather than a chain of them.
__device__ void MakeTile(const PrefillAttentionParams& p, int e, int s0, int e_end, int entries_per_tile, int pos_lo,
                         int pos_hi, TileDesc* d) {
  constexpr unsigned kAll = 0xffffffffu;
  const int lane = threadIdx.x & 31;
  if (e >= e_end) {
    if (lane == 0) d->valid = 0;
    return;
  }
  int dl = 0, tk = 0, st = 0, bl = 0;
  if (lane < kMaxEntriesPerTile) {
    const int idx = min(e + lane, e_end - 1);
    dl = __ldg(p.kv.block_deltas + idx);
    tk = __ldg(p.kv.block_tokens + idx);
    st = __ldg(p.kv.block_starts + idx);
    bl = __ldg(p.kv.block_ids + idx);
  }
  const int dl0 = __shfl_sync(kAll, dl, 0), tk0 = __shfl_sync(kAll, tk, 0), st0 = __shfl_sync(kAll, st, 0);
  if (st0 + s0 > pos_hi) {  // entries are in logical order: nothing further is visible
    if (lane == 0) d->valid = 0;
    return;
  }
  // The tile: the leading entries (up to entries_per_tile) that exist and share entry e's delta.
  const unsigned same = __ballot_sync(kAll, lane < entries_per_tile && e + lane < e_end && dl == dl0);
  const int ne = __ffs(~same) - 1;  // bit 0 is always set
  bool full;
  int max_logical;
  if (entries_per_tile == 1) {  // block_size >= kBN
    full = s0 + kBN <= tk0;
    max_logical = st0 + min(tk0, s0 + kBN) - 1;
  } else {
    const unsigned full_blocks = __ballot_sync(kAll, lane < ne && tk == p.kv.block_size);
    full = ne == entries_per_tile && full_blocks == same;
    max_logical = __shfl_sync(kAll, st + tk - 1, ne - 1);
  }
  if (lane < kMaxEntriesPerTile) {
    d->block[lane] = bl;
    d->tok[lane] = tk;
    d->start[lane] = st;
  }
  if (lane == 0) {
    d->valid = 1;
    d->e = e;
    d->s0 = s0;
    d->ne = ne;
    d->delta = dl0;
    d->needs_mask = !full || max_logical > pos_lo;
    // Pull the next lines of the block table into L1 early.
    const int ahead = min(e + 32, e_end - 1);
    asm volatile("prefetch.global.L1 [%0];" ::"l"(p.kv.block_ids + ahead));
    asm volatile("prefetch.global.L1 [%0];" ::"l"(p.kv.block_tokens + ahead));
    asm volatile("prefetch.global.L1 [%0];" ::"l"(p.kv.block_starts + ahead));
    asm volatile("prefetch.global.L1 [%0];" ::"l"(p.kv.block_deltas + ahead));
  }
}

// The tile after `cur` (one warp, as MakeTile).
__device__ void NextTile(const PrefillAttentionParams& p, const TileDesc& cur, int e_end, int entries_per_tile,
                         int pos_lo, int pos_hi, TileDesc* next) {
  const int e = cur.e, ne = cur.ne, s0 = cur.s0, tok0 = cur.tok[0];
  if (entries_per_tile == 1 && s0 + kBN < tok0) {
    MakeTile(p, e, s0 + kBN, e_end, entries_per_tile, pos_lo, pos_hi, next);
  } else {
    MakeTile(p, e + ne, 0, e_end, entries_per_tile, pos_lo, pos_hi, next);
  }
}

// The bytes a 16-byte copy reads: 0 in the math_only probe build (kernels/CMakeLists.txt), whose
// copies zero-fill the ring and read no memory, so that the consumers' math runs on zeros.
#ifdef LAZYKV_PREFILL_PROBE_MATH_ONLY
constexpr int kProbeCopyBytes = 0;
#else
constexpr int kProbeCopyBytes = 16;
#endif

// Issues the cp.async copies of one KV tile's keys or values (pool: k_pool or v_pool) into
// dst, swizzled for wgmma, and, when col_pos is not null and the tile needs the mask, each
// column's logical position (INT_MAX for an empty column). Each of kCopyThreads threads (t)
// copies one 16-byte chunk of kRows consecutive rows, which lie in one block-table entry
// (blocks hold at least 16 slots), so it reads the tile descriptor once.
template <int HD, int kCopyThreads>
__device__ __forceinline__ void LoadTileRows(const PrefillAttentionParams& p, const TileDesc& d, int log2bs, int kvh,
                                             const void* pool, uint32_t dst, int* col_pos, int t) {
  constexpr int kChunksPerRow = HD / 8;
  constexpr int kRows = kBN * kChunksPerRow / kCopyThreads;  // 256 threads: 8 at head dim 128, 4 at 64
  static_assert(kRows <= 16, "a thread's rows must lie in one block-table entry (blocks hold >= 16 slots)");
  const int ch = t % kChunksPerRow, r0 = (t / kChunksPerRow) * kRows;
  const int idx = d.s0 + r0;
  const int k = idx >> log2bs;
  const int slot0 = idx & (p.kv.block_size - 1);
  const bool entry = k < d.ne;
  const int tokens = entry ? d.tok[k] : 0;
  const int slot_stride = p.kv.n_kv_heads * HD;
  const long long base =
      entry ? (static_cast<long long>(d.block[k]) * p.kv.block_size + slot0) * slot_stride + kvh * HD + ch * 8 : 0;
  const int start = entry ? d.start[k] + slot0 : 0;
  const __nv_bfloat16* src = static_cast<const __nv_bfloat16*>(pool) + base;
  // The rows' source addresses advance in two interleaved chains. With one, ptxas computes
  // every address into the same register pair, and a copy holds its address register until
  // the memory pipe has read it, so each address waited for the copy before it (the copy
  // warps took 1270 cycles to issue a tile's keys, 937 with two chains; two chains, not
  // four: four measured no faster).
  constexpr int kChains = 2;
  static_assert(kRows % kChains == 0, "whole rounds of the chains");
  const __nv_bfloat16* from[kChains];
#pragma unroll
  for (int u = 0; u < kChains; ++u) from[u] = src + u * slot_stride;
  if (!d.needs_mask) {  // every slot holds a key and every key is visible: no checks, no positions
#pragma unroll
    for (int i = 0; i < kRows; i += kChains) {
#pragma unroll
      for (int u = 0; u < kChains; ++u) {
        CpAsync16(dst + wgmma::SwizzledOffset<kBN>(r0 + i + u, ch), from[u], kProbeCopyBytes);
        from[u] += kChains * slot_stride;
      }
    }
    return;
  }
#pragma unroll
  for (int i = 0; i < kRows; i += kChains) {
#pragma unroll
    for (int u = 0; u < kChains; ++u) {
      // An empty slot is zero-filled (no byte read); its address still lies in the pool: in
      // the same block as the thread's first row, or (no entry) in the pool's first block.
      const bool valid = slot0 + i + u < tokens;
      CpAsync16(dst + wgmma::SwizzledOffset<kBN>(r0 + i + u, ch), from[u], valid ? kProbeCopyBytes : 0);
      if (col_pos != nullptr && ch == 0) col_pos[r0 + i + u] = valid ? start + i + u : INT_MAX;
      from[u] += kChains * slot_stride;
    }
  }
}

// One warp (all lanes): asks L2 for the keys and values of tile d (prefetch.global.L2), so that
// its copies find them there. A hint that changes no value a later read sees (every write, a
// kernel's or a copy engine's, lands in L2), so a kernel may issue it before it waits for the
// kernel before it (dependent_launch.cuh): the tile's reads then overlap that kernel.
template <int HD>
__device__ __forceinline__ void PrefetchTileToL2(const PrefillAttentionParams& p, const TileDesc& d, int log2bs,
                                                 int kvh) {
  if (!d.valid) return;
  constexpr int kLinesPerRow = HD * 2 / 128;  // 128-byte lines of one slot's row of a KV head
  const int slot_stride = p.kv.n_kv_heads * HD;
  const char* k_pool = static_cast<const char*>(p.kv.k_pool);
  const char* v_pool = static_cast<const char*>(p.kv.v_pool);
  for (int i = threadIdx.x & 31; i < kBN * kLinesPerRow; i += 32) {
    const int idx = d.s0 + i / kLinesPerRow;
    const int k = idx >> log2bs;
    if (k >= d.ne) break;  // past the tile's entries (idx grows with i)
    const int slot = idx & (p.kv.block_size - 1);
    if (slot >= d.tok[k]) continue;
    const long long bytes =
        ((static_cast<long long>(d.block[k]) * p.kv.block_size + slot) * slot_stride + kvh * HD) * 2 +
        (i % kLinesPerRow) * 128;
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(k_pool + bytes));
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(v_pool + bytes));
  }
}

// Both halves of a KV tile: keys (with the column positions), then values.
template <int HD, int kCopyThreads>
__device__ __forceinline__ void LoadTile(const PrefillAttentionParams& p, const TileDesc& d, int log2bs, int kvh,
                                         uint32_t k_smem, uint32_t v_smem, int* col_pos, int t) {
  LoadTileRows<HD, kCopyThreads>(p, d, log2bs, kvh, p.kv.k_pool, k_smem, col_pos, t);
  LoadTileRows<HD, kCopyThreads>(p, d, log2bs, kvh, p.kv.v_pool, v_smem, nullptr, t);
}

}  // namespace
}  // namespace lazykv::cuda
