// The lazy prefill kernel with a warpgroup that rotates the query (FlashAttention-3's warp
// specialization, plus one role). Included only by lazy_prefill_attention.cu.
//
// One CTA: 128 query rows (128 queries of one head, or 128 / pack queries of pack heads of
// one KV group), four warpgroups.
//  - Copy (warpgroup 0) walks the block table and copies K and V tiles with cp.async into a
//    3-slot ring: the keys and values of tile j are loads 2 j and 2 j + 1, and load i goes to
//    slot i % 3 once load i - 3 is done with (K(j + 1) reuses the slot of V(j - 1), V(j + 1)
//    that of K(j)): two tiles in flight in 96 KB, which leaves room for two query buffers.
//  - Rotation (warpgroup 1): for the k-th run of block-table entries that share a delta d
//    (k > 0), writes R(p - d) q rounded once to bf16 into query buffer k & 1, from the fp32
//    R(p) q tile, as soon as the consumers have released delta k - 2: a whole delta ahead of
//    them, so no rotation sits on the consumers' path. The query is rotated once per delta,
//    never the keys. The consumers make the fp32 tile and the first run's query themselves at
//    the CTA's start (MakeFirstQuery), where they would only wait for it.
//  - Two consumers (warpgroups 2 and 3, 64 query rows each) run the products and the online
//    softmax; their scores take turns on the tensor cores (named barriers), so one consumer's
//    softmax runs while the other's products do, and each issues the first half of a tile's
//    P V before it makes the second half's exponentials (SoftmaxAndIssueValues).
// The roles take the registers they need (setmaxnreg): copy 56, rotation 40, consumers 208.
#pragma once

#include <cfloat>
#include <cstdint>

#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/lazy_prefill_attention.h"
#include "kernels/cuda/lazy_prefill_cta.cuh"
#include "kernels/cuda/lazy_prefill_math.cuh"
#include "kernels/cuda/lazy_prefill_query.cuh"
#include "kernels/cuda/lazy_prefill_tiles.cuh"
#include "kernels/cuda/lazy_prefill_work_starts.cuh"
#include "kernels/cuda/mbarrier.cuh"
#include "kernels/cuda/prefill_timeline.cuh"
#include "kernels/cuda/tma.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace lazykv::cuda {
namespace {

constexpr int kRingSlots = 3;

struct StageInfo {
  int needs_mask;
  int first_of_delta;  // wait for this delta's query buffer
  int last_of_delta;   // release the query buffer after this tile's scores
  int last;            // no tile follows
};

struct SpecBarriers {
  uint64_t full[kRingSlots], empty[kRingSlots];
  uint64_t q_full[2], q_empty[2];
  uint64_t first_query;  // the one-tile kernel's consumers have made R(p) q and the first query
  uint64_t raw_full;     // the persistent kernel's raw query rows have landed (its own init)
};

constexpr int kSpecThreads = 4 * 128;
// Registers per thread after the split (setmaxnreg; multiples of 8). The launch gives each
// thread 65536 / 512 = 128, and a warpgroup's increase is served only from what the CTA's
// other warps gave back: growing past that pool blocks forever.
constexpr int kLaunchRegs = 65536 / kSpecThreads;  // 128
constexpr int kCopyRegs = 56;
constexpr int kRotationRegs = 40;
constexpr int kConsumerRegs = 208;
static_assert((kCopyRegs + kRotationRegs + 2 * kConsumerRegs) * 128 <= kLaunchRegs * kSpecThreads,
              "over the CTA's registers");

// One thread, before a CTA barrier: the ring's barriers (full: each copy thread arrives for its
// copies and for its stores; empty: each consumer thread) and the query buffers' (full: each
// rotation thread; empty: each consumer thread).
__device__ __forceinline__ void InitSpecBarriers(SpecBarriers* bars) {
  for (int b = 0; b < kRingSlots; ++b) {
    mbarrier::Init(&bars->full[b], 2 * 128);
    mbarrier::Init(&bars->empty[b], 256);
  }
  for (int b = 0; b < 2; ++b) {
    mbarrier::Init(&bars->q_full[b], 128);
    mbarrier::Init(&bars->q_empty[b], 256);
  }
  mbarrier::Init(&bars->first_query, 256);  // each consumer thread
}

// Named barriers: 1 among the copy warps; 2 + c, consumer c's turn to issue its scores (2 and 3);
// 4 among the rotation warps; 5 + c among consumer c's warps (the one-tile kernel's first query).
__device__ __forceinline__ void CopySync() { asm volatile("bar.sync 1, 128;\n" ::: "memory"); }
__device__ __forceinline__ void TurnSync(int c) { asm volatile("bar.sync %0, 256;\n" ::"r"(2 + c) : "memory"); }
__device__ __forceinline__ void TurnArrive(int c) { asm volatile("bar.arrive %0, 256;\n" ::"r"(2 + c) : "memory"); }
__device__ __forceinline__ void RotationSync() { asm volatile("bar.sync 4, 128;\n" ::: "memory"); }
__device__ __forceinline__ void ConsumerSync(int c) { asm volatile("bar.sync %0, 128;\n" ::"r"(5 + c) : "memory"); }

// The one-tile kernel's q_full phase parity for run k >= 1: the rotation warps fill no phase for
// run 0 (the consumers make that query), so buffer k & 1's phases count runs k = 1, 3, 5, ...
// (buffer 1) and 2, 4, ... (buffer 0): phase (k - 1) >> 1 either way.
__device__ __forceinline__ int QueryFullParity(int k) { return ((k - 1) >> 1) & 1; }

template <int kRegs>
__device__ __forceinline__ void ShrinkRegisters() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void GrowRegisters() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// The rotation warps: the start of the run of block-table entries after the run
// that starts at entry e (delta `delta`): the first entry in (e, e_end) with another delta,
// or e_end. Reads 32 entries a step (all lanes).
__device__ __forceinline__ int NextRunStart(const PrefillAttentionParams& p, int e, int e_end, int delta) {
  const int lane = threadIdx.x & 31;
  for (int base = e + 1; base < e_end; base += 32) {
    const int idx = base + lane;
    const unsigned differ = __ballot_sync(0xffffffffu, idx < e_end && __ldg(p.kv.block_deltas + idx) != delta);
    if (differ != 0) return base + __ffs(differ) - 1;
  }
  return e_end;
}

// Stage: the per-tile record the copy warps hand to the consumers (StageInfo, or the
// persistent kernel's, lazy_prefill_persistent.cuh).
template <int HD, typename Stage = StageInfo>
struct SpecSmemLayout {
  static constexpr int kRawQBytes = kBM * HD * 4;
  static constexpr int kKvBytes = kBN * HD * 2;
  static constexpr int kQBytes = kBM * HD * 2;
  static constexpr int kRawQ = 0;                                             // fp32 [kBM][HD]: R(p) q (RawQueryIndex)
  static constexpr int kQ = kRawQ + kRawQBytes;                               // 2 buffers, bf16 R(p - d) q, swizzled
  static constexpr int kRing = kQ + 2 * kQBytes;                              // kRingSlots K or V tiles
  static constexpr int kColPos = kRing + kRingSlots * kKvBytes;               // int [2][kBN]
  static constexpr int kStage = kColPos + 2 * kBN * 4;                        // Stage [2]
  static constexpr int kDesc = kStage + 2 * static_cast<int>(sizeof(Stage));  // TileDesc [kDescSlots]
  static constexpr int kBars = (kDesc + kDescSlots * static_cast<int>(sizeof(TileDesc)) + 7) / 8 * 8;
  static constexpr int kBytes = kBars + static_cast<int>(sizeof(SpecBarriers));
  static constexpr int kAllocBytes = kBytes + 1024;  // room to align the dynamic base
  static_assert(kAllocBytes <= 227 * 1024, "over the shared memory of one CTA on Hopper");
};

// Load i of the ring (keys of tile j: i = 2 j; values: 2 j + 1): its slot, and the parity of
// the slot's phase that it fills.
__device__ __forceinline__ int RingSlot(int i) { return i % kRingSlots; }
__device__ __forceinline__ int RingParity(int i) { return (i / kRingSlots) & 1; }

// Whether tile d's kBN slots lie at consecutive pool slots: a valid tile that needs no mask (every
// slot holds a visible key, so its entries are whole blocks, or one block's kBN slots) whose
// entries' blocks follow each other in the pool. Every copy thread reads it (the same descriptor),
// once a tile, with every load in flight at once (short-circuit tests made a chain of loads and
// branches on the copy warps' path: 4-5% slower).
__device__ __forceinline__ bool TileAtConsecutiveSlots(const TileDesc& d) {
  const int b0 = d.block[0], ne = d.ne;
  bool consecutive = d.valid != 0 && d.needs_mask == 0;
#pragma unroll
  for (int k = 1; k < kMaxEntriesPerTile; ++k) {
    const bool follows = d.block[k] == b0 + k;  // loaded whether or not entry k is in the tile
    consecutive &= (k >= ne) | follows;
  }
  return consecutive;
}

// A copy thread's part of one load of the ring (d's keys or values, pool: k_pool or v_pool) into
// the slot at dst, and its two arrivals on the slot's full barrier: one once its copies land, one
// that releases its stores of the stage info and column positions. By TMA boxes where `by_map`
// (kMaps and TileAtConsecutiveSlots(d)): one a 64-column block, issued by thread 0, their bytes
// counted on the barrier (map: MakeKvPoolTensorMap's); else by the 128 threads' cp.async copies.
// With blocks of 16 slots, one box takes the place of 128 threads' 16 copies each (a box per
// 16-slot entry, eight a tile, had been slower than cp.async: bench/results/prefill_overlap_2026-11-28.md).
// kMaps: the launch has the maps; the copy loops are compiled apart for either case (a branch on
// a null map in one loop made the kernel 2-3% slower without maps).
template <int HD, bool kMaps>
__device__ __forceinline__ void IssueTileLoad(const PrefillAttentionParams& p, const TileDesc& d, bool by_map,
                                              int log2bs, int kvh, const void* pool, const CUtensorMap* map,
                                              uint32_t dst, int* positions, uint64_t* full, int t) {
  if (kMaps && by_map) {
    if (t == 0) {
      tma::ArriveExpectBytes(full, kBN * HD * 2);
      const int slot = d.block[0] * p.kv.block_size + d.s0;
#pragma unroll
      for (int h = 0; h < HD / 64; ++h) tma::Load3d(dst + h * kBN * 128, map, h * 64, kvh, slot, full);
    } else {
      mbarrier::Arrive(full);
    }
  } else {
    if (d.valid) LoadTileRows<HD, 128>(p, d, log2bs, kvh, pool, dst, positions, t);
    mbarrier::ArriveOnCopies(full);
  }
  mbarrier::Arrive(full);
}

// The copy warpgroup (t: 0 .. 127): each load waits for its slot (the consumers' release of
// load i - 3), issues its copies, and arrives twice on the slot's full barrier: once its
// copies land (.noinc), and once to release its stores of the stage info and column
// positions. desc[0] and desc[1] are made before the split; warp 0 makes desc[j + 2] during
// iteration j.
template <int HD, bool kMaps>
__device__ void RunCopyWarps(const PrefillAttentionParams& p, const CtaWork& w, int e_hi, int log2bs,
                             unsigned char* smem, const CUtensorMap* k_map, const CUtensorMap* v_map) {
  using L = SpecSmemLayout<HD>;
  const int t = threadIdx.x;
  TileDesc* desc = reinterpret_cast<TileDesc*>(smem + L::kDesc);
  StageInfo* info = reinterpret_cast<StageInfo*>(smem + L::kStage);
  int* col_pos = reinterpret_cast<int*>(smem + L::kColPos);
  SpecBarriers* bars = reinterpret_cast<SpecBarriers*>(smem + L::kBars);
  const uint32_t ring = SmemAddr(smem + L::kRing);
  const auto acquire = [&](int i) {  // load i's slot, released by the consumers after load i - 3
    if (i >= kRingSlots) mbarrier::Wait(&bars->empty[RingSlot(i)], RingParity(i) ^ 1);
  };
  const auto issue = [&](int i, const TileDesc& d, bool by_map, const void* pool, const CUtensorMap* map,
                         int* positions) {
    IssueTileLoad<HD, kMaps>(p, d, by_map, log2bs, w.kvh, pool, map, ring + RingSlot(i) * L::kKvBytes, positions,
                             &bars->full[RingSlot(i)], t);
  };
  int prev_delta = 0;
  for (int j = 0;; ++j) {
    const TileDesc& d = desc[j % kDescSlots];
    const TileDesc& dn = desc[(j + 1) % kDescSlots];
    const bool last = !dn.valid;
    const bool first_of_delta = j == 0 || d.delta != prev_delta;
    const bool last_of_delta = last || dn.delta != d.delta;
    prev_delta = d.delta;
    const bool by_map = kMaps && TileAtConsecutiveSlots(d);
    // Keys. info and col_pos [j & 1] were last read for tile j - 2, before the consumers
    // released V(j - 2), the load that the keys of tile j wait for.
    acquire(2 * j);
    if (t == 0) {
      LAZYKV_TIMELINE(j, kKeySlot);
      info[j & 1] = StageInfo{d.needs_mask, first_of_delta ? 1 : 0, last_of_delta ? 1 : 0, last ? 1 : 0};
    }
    issue(2 * j, d, by_map, p.kv.k_pool, k_map, col_pos + (j & 1) * kBN);
    if (t == 0) LAZYKV_TIMELINE(j, kKeysIssued);
    acquire(2 * j + 1);
    if (t == 0) LAZYKV_TIMELINE(j, kValueSlot);
    issue(2 * j + 1, d, by_map, p.kv.v_pool, v_map, nullptr);
    if (t == 0) LAZYKV_TIMELINE(j, kValuesIssued);
    if (last) return;
    if (t < 32) NextTile(p, dn, e_hi, w.entries_per_tile, w.pos_lo, w.pos_hi, &desc[(j + 2) % kDescSlots]);
    CopySync();  // desc[j + 2] is written; every copy warp is done with desc[j]
  }
}

// The rotation warpgroup (t: 0 .. 127): for each run of the table's visible entries after the
// first (delta k: the k-th run) R(p - d) q into buffer k & 1, from the fp32 R(p) q tile that
// the consumers made with the first run's query (MakeFirstQuery), as soon as the consumers
// have released delta k - 2 — a whole delta ahead of the consumers.
template <int HD>
__device__ void RunRotationWarps(const PrefillAttentionParams& p, const CtaWork& w, unsigned char* smem) {
  using L = SpecSmemLayout<HD>;
  const int t = threadIdx.x - 128;
  SpecBarriers* bars = reinterpret_cast<SpecBarriers*>(smem + L::kBars);
  const float* raw_q = reinterpret_cast<const float*>(smem + L::kRawQ);
  unsigned char* q_buf = smem + L::kQ;
  int e = 0, e_hi = 0;
  SplitEntryRange(p, w, &e, &e_hi);
  mbarrier::Wait(&bars->first_query, 0);  // the consumers' R(p) q rows and the first run's query
  if (t == 0) LAZYKV_TIMELINE(0, kFirstQueryMade);
  for (int k = 0; e < e_hi && __ldg(p.kv.block_starts + e) <= w.pos_hi; ++k) {
    const int delta = __ldg(p.kv.block_deltas + e);
    const int b = k & 1;
    if (k > 0) {  // the first run's query is the consumers' (no q_full phase: QueryFullParity)
      if (k >= 2) mbarrier::Wait(&bars->q_empty[b], ((k >> 1) - 1) & 1);
      WriteQueryForDelta<HD>(p, raw_q, delta, t, SmemAddr(q_buf + b * L::kQBytes));
      wgmma::FenceProxyAsync();  // the rows, read next by wgmma (async proxy)
      mbarrier::Arrive(&bars->q_full[b]);
    }
    e = NextRunStart(p, e, e_hi, delta);
  }
}

// At the CTA's start, consumer c's 128 threads (t) make its 64 query rows [64 c, 64 c + 64)
// of the first run (delta d: desc[0]'s): the raw rows go from global memory straight into
// registers, all loads in flight at once; R(p) q goes into the fp32 tile (RawQueryIndex's
// layout, for the rotation warps' later deltas) and R(p - d) q, rounded once to bf16, into
// its half of query buffer 0, in one pass. The consumers would otherwise wait for the
// rotation warpgroup, whose single warp per scheduler took ~10000 cycles from the CTA's start
// to the first query (loads through shared memory, then two latency-bound passes); they
// are idle then, and have registers to hold the rows. The angle of a thread's first row is
// formed in double (exact); later rows advance it by a rotation of the row step (none where
// the rows came rotated: p.q_rotated).
template <int HD>
constexpr int kFirstQuerySteps = 64 / QueryLanes<HD, 128>::kRowsPerStep;  // a consumer thread's rows

// The loads of MakeFirstQuery, issued by the kernel right after WaitForPriorGrid, so that they
// are in flight while copy warp 0 walks the block table and the CTA's barrier waits for it.
template <int HD>
__device__ __forceinline__ void LoadFirstQueryRows(const PrefillAttentionParams& p, const CtaWork& w, int c, int t,
                                                   float4 (&x)[kFirstQuerySteps<HD>]) {
  using Lanes = QueryLanes<HD, 128>;
  const Lanes lanes(p.kv.rope_style, t);
  const int r0 = 64 * c + lanes.rsub;
#pragma unroll
  for (int i = 0; i < kFirstQuerySteps<HD>; ++i) {
    const int r = r0 + i * Lanes::kRowsPerStep;
    // Rows past the tile's queries are zeros (LoadRawQuery's). Plain loads, not the read-only
    // path: q was written by the kernel before (a dependent launch may overlap it until
    // WaitForPriorGrid).
    x[i] = r < w.rows ? lanes.LoadRow(w.q_tile + static_cast<size_t>(RowPair(w, r)) * HD)
                      : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
}

// The rest of MakeFirstQuery: x holds LoadFirstQueryRows' rows.
template <int HD>
__device__ __forceinline__ void MakeFirstQuery(const PrefillAttentionParams& p, const CtaWork& w, int c, int delta,
                                               int t, const float4 (&x)[kFirstQuerySteps<HD>], float* tile,
                                               unsigned char* q_smem) {
  using Lanes = QueryLanes<HD, 128>;
  const Lanes lanes(p.kv.rope_style, t);
  const int r0 = 64 * c + lanes.rsub;
  // Rows that came rotated (p.q_rotated) take the identity for R(p), which leaves them exact.
  float cp[2] = {1.0f, 1.0f}, sp[2] = {0.0f, 0.0f}, cs[2] = {1.0f, 1.0f}, ss[2] = {0.0f, 0.0f}, cd[2], sd[2];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const double th = __ldg(p.kv.inv_freq + lanes.f0 + j);
    if (!p.q_rotated) {
      RopeSinCos(th, w.pos_lo + (r0 >> w.log2_pack), &sp[j], &cp[j]);
      RopeSinCos(th, Lanes::kRowsPerStep >> w.log2_pack, &ss[j], &cs[j]);
    }
    RopeSinCos(th, -static_cast<long long>(delta), &sd[j], &cd[j]);
  }
#pragma unroll
  for (int i = 0; i < kFirstQuerySteps<HD>; ++i) {
    const int r = r0 + i * Lanes::kRowsPerStep;
    const float4 y = Rotate(x[i], cp, sp);
    lanes.Store(tile, r, y);
    lanes.StoreBf16(q_smem, r, Rotate(y, cd, sd));
    AdvanceAngle(cp, sp, cs, ss);
  }
}

// A consumer with no query row in its half (a tile at most half full, as a short question's
// packed tile is) keeps the ring's and the query buffers' counts tile by tile, without products
// or turns; it waits for each delta's query as a computing consumer does, so that its release
// of a query buffer cannot run ahead into the buffer's next use.
__device__ __forceinline__ void ReleaseTiles(SpecBarriers* bars, const StageInfo* info) {
  int k = -1;  // the delta's index
  for (int j = 0;; ++j) {
    const int ks = RingSlot(2 * j), vs = RingSlot(2 * j + 1);
    mbarrier::Wait(&bars->full[ks], RingParity(2 * j));
    const StageInfo in = info[j & 1];
    if (in.first_of_delta && ++k > 0) mbarrier::Wait(&bars->q_full[k & 1], QueryFullParity(k));
    mbarrier::Arrive(&bars->empty[ks]);
    if (in.last_of_delta) mbarrier::Arrive(&bars->q_empty[k & 1]);
    mbarrier::Wait(&bars->full[vs], RingParity(2 * j + 1));
    mbarrier::Arrive(&bars->empty[vs]);
    if (in.last) return;
  }
}

// Consumer c (0 or 1): query rows 64 c .. 64 c + 63. Where the other consumer's rows are all
// past the tile's (ReleaseTiles), this one takes no turns.
template <int HD>
__device__ void RunConsumer(const PrefillAttentionParams& p, const CtaWork& w, float scale_log2, unsigned char* smem,
                            const float4 (&first_rows)[kFirstQuerySteps<HD>]) {
  using L = SpecSmemLayout<HD>;
  const int c = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 128), 0) - 2;  // warp-uniform to ptxas
  const int my_row0 = c * 64 + ((threadIdx.x % 128) / 32) * kRowsPerWarp + (threadIdx.x % 32) / 4;
  const StageInfo* info = reinterpret_cast<const StageInfo*>(smem + L::kStage);
  const int* col_pos = reinterpret_cast<const int*>(smem + L::kColPos);
  SpecBarriers* bars = reinterpret_cast<SpecBarriers*>(smem + L::kBars);
  const uint32_t q_half = SmemAddr(smem + L::kQ) + c * 64 * 128;  // this consumer's half of buffer 0
  const uint32_t ring = SmemAddr(smem + L::kRing);

  float o[HD / 2];
#pragma unroll
  for (int i = 0; i < HD / 2; ++i) o[i] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const int row_pos[2] = {RowPosition(w, my_row0), RowPosition(w, my_row0 + 8)};
  MakeFirstQuery<HD>(p, w, c, reinterpret_cast<const TileDesc*>(smem + L::kDesc)[0].delta, threadIdx.x % 128,
                     first_rows, reinterpret_cast<float*>(smem + L::kRawQ), smem + L::kQ);
  wgmma::FenceProxyAsync();              // the query rows, read next by wgmma (async proxy)
  mbarrier::Arrive(&bars->first_query);  // for the rotation warps' later deltas
  ConsumerSync(c);                       // this consumer's half of the first query is written
#ifdef LAZYKV_PREFILL_PROBE_COPY_ONLY    // a diagnostic build (kernels/CMakeLists.txt): the tiles' loads only
  ReleaseTiles(bars, info);
  return;
#endif
  if (c * 64 >= w.rows) {  // nothing of this consumer's to compute
    ReleaseTiles(bars, info);
    return;
  }
  const bool turns = w.rows > 64;  // the other consumer computes too
  int k = -1;                      // the delta's index
  for (int j = 0;; ++j) {
    const int ks = RingSlot(2 * j), vs = RingSlot(2 * j + 1);
    mbarrier::Wait(&bars->full[ks], RingParity(2 * j));
    const StageInfo in = info[j & 1];
    if (in.first_of_delta) {
      ++k;
      if (k > 0) mbarrier::Wait(&bars->q_full[k & 1], QueryFullParity(k));  // run 0's: ConsumerSync
    }
    const bool stamps = threadIdx.x % 128 == 0;  // one thread of the consumer (diagnostic builds)
    if (stamps) LAZYKV_TIMELINE(j, 5 * c + kKeysReady);
    wgmma::FenceProxyAsync();  // the keys' cp.async copies (and the query rows), read next by wgmma
    float s[kBN / 2];
    if (turns && (c == 1 || j > 0)) TurnSync(c);
    if (stamps) LAZYKV_TIMELINE(j, 5 * c + kTurn);
    IssueScores<HD>(s, q_half + (__shfl_sync(0xffffffffu, k, 0) & 1) * L::kQBytes, ring + ks * L::kKvBytes);
    wgmma::Wait<0>();
    wgmma::PinRegisters(s);
    if (stamps) LAZYKV_TIMELINE(j, 5 * c + kScoresDone);
    if (turns && (c == 0 || !in.last)) TurnArrive(1 - c);  // consumer 0 takes no turn after its last tile
    mbarrier::Arrive(&bars->empty[ks]);
    if (in.last_of_delta) mbarrier::Arrive(&bars->q_empty[k & 1]);

    SoftmaxAndIssueValues<HD>(s, o, m, l, col_pos + (j & 1) * kBN, in.needs_mask, row_pos, scale_log2,
                              ring + vs * L::kKvBytes, [&] {
                                if (stamps) LAZYKV_TIMELINE(j, 5 * c + kSoftmaxDone);  // its first half
                                mbarrier::Wait(&bars->full[vs], RingParity(2 * j + 1));
                                wgmma::FenceProxyAsync();  // the values' copies
                              });
    wgmma::Wait<0>();
    wgmma::PinRegisters(o);
    if (stamps) LAZYKV_TIMELINE(j, 5 * c + kValuesDone);
    mbarrier::Arrive(&bars->empty[vs]);
    if (in.last) break;
  }
  if (p.out_bf16 != nullptr && w.splits == 1) {
    WriteRowsBf16<HD>(p, w, o, l, my_row0);
  } else {
    WriteRows<HD>(p, w, o, m, l, my_row0, scale_log2);
  }
  if (threadIdx.x == 256) {
    LAZYKV_TIMELINE(0, kRowsWritten);
    LAZYKV_TIMELINE_NS(0, kRowsWrittenNs);
  }
}

// starts: null (warp 0 walks the table), or the launch's work starts (OneTileWorkIndex), made by
// an earlier launch (starts_made: read before the kernel waits for the grid before it, so the
// kernel that made them must have completed before that grid began:
// PrefillAttentionParams::work_starts_made) or by the grid just before it (read after the wait).
template <int HD>
__global__ void __launch_bounds__(kSpecThreads, 1)
    LazyPrefillSpecializedKernel(const PrefillAttentionParams p, int log2bs, float scale_log2, int splits,
                                 int log2_pack, const PrefillWorkStart* starts, int starts_made,
                                 const __grid_constant__ CUtensorMap k_map, const __grid_constant__ CUtensorMap v_map,
                                 int kv_maps) {
  AllowDependentLaunch();  // launched by LaunchDependent (dependent_launch.cuh): the combine may come in
  if (threadIdx.x == 0) {
    LAZYKV_TIMELINE(0, kEntry);
    LAZYKV_TIMELINE_NS(0, kEntryNs);
  }
  using L = SpecSmemLayout<HD>;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - (SmemAddr(smem_raw) & 1023)) & 1023);
  // Until WaitForPriorGrid, only the launch's tables, and starts made by an earlier launch, are
  // read (the header's contract): the walk of the block table (or the starts' read) and the first
  // tiles' requests to L2 overlap the kernel before this one.
  const CtaWork w = MakeCtaWork<HD>(p, log2bs, splits, log2_pack);
  if (!w.active) return;
  if (threadIdx.x == 0) LAZYKV_TIMELINE(0, kWorkMade);
  TileDesc* desc = reinterpret_cast<TileDesc*>(smem + L::kDesc);
  if (starts != nullptr && !starts_made) WaitForPriorGrid();  // the grid before makes the starts
  int e_hi = 0;
  if (threadIdx.x < 32) {  // copy warp 0: the first tiles, from the starts or by walking the block table
    e_hi = starts == nullptr ? MakeFirstTiles<HD>(p, w, log2bs, &desc[0], &desc[1])
                             : ReadFirstTiles<HD>(p, starts[OneTileWorkIndex()], log2bs, w.kvh, &desc[0], &desc[1]);
    if (threadIdx.x == 0) LAZYKV_TIMELINE(0, kFirstTilesMade);
  }
  if (threadIdx.x == 0) InitSpecBarriers(reinterpret_cast<SpecBarriers*>(smem + L::kBars));
  WaitForPriorGrid();  // before anything an earlier kernel wrote (the queries, the new keys) is read
  if (threadIdx.x == 0) LAZYKV_TIMELINE(0, kPriorGridDone);
  float4 first_rows[kFirstQuerySteps<HD>];  // the consumers' raw query rows (MakeFirstQuery)
  if (threadIdx.x >= 256) LoadFirstQueryRows<HD>(p, w, threadIdx.x / 128 - 2, threadIdx.x % 128, first_rows);
  __syncthreads();
  LAZYKV_TIMELINE_CTA_START();
  if (!desc[0].valid) {
    if (p.out_bf16 != nullptr && splits == 1) {
      WriteEmptyRowsBf16<HD>(p, w, threadIdx.x, kSpecThreads);
    } else {
      WriteEmptyRows<HD>(p, w, threadIdx.x, kSpecThreads);
    }
    return;
  }
  if (threadIdx.x < 128) {
    ShrinkRegisters<kCopyRegs>();
    if (threadIdx.x == 0) LAZYKV_TIMELINE(0, kCopyStart);
    if (kv_maps) {
      RunCopyWarps<HD, true>(p, w, e_hi, log2bs, smem, &k_map, &v_map);
    } else {
      RunCopyWarps<HD, false>(p, w, e_hi, log2bs, smem, nullptr, nullptr);
    }
  } else if (threadIdx.x < 256) {
    ShrinkRegisters<kRotationRegs>();
    RunRotationWarps<HD>(p, w, smem);
  } else {
    GrowRegisters<kConsumerRegs>();
    RunConsumer<HD>(p, w, scale_log2, smem, first_rows);
  }
}

}  // namespace
}  // namespace lazykv::cuda
