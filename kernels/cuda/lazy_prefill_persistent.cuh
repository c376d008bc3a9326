// The lazy prefill kernel of lazy_prefill_specialized.cuh made persistent (FlashAttention-3's
// persistent tile scheduler): a grid of at most one CTA an SM, each CTA taking many work tiles
// (WorkList: tiles b, b + gridDim.x, ... from the heaviest causal tiles down). The roles run
// on across work tiles: the copy warps take the next work tile's start (read from the work
// starts that PrefillWorkStartsKernel made before the kernel, or walked from its block table
// without them) and issue its first loads while the consumers finish the one before, and the
// rotation warps take its raw query rows (one TMA box: query_tensor_map.h) and write its first
// delta's query in the same time; the ring, the query buffers and the consumers' turns
// count across work tiles. Where the output is wanted in bf16 (PrefillAttentionParams::out_bf16)
// a consumer stages its rows in its half of the last query buffer and one thread stores them as
// TMA boxes. Short KV loops gain most (their start and end were exposed: one CTA
// an SM); the one-work-tile-a-CTA kernel stays for long ones (lazy_prefill_attention.cu
// chooses). Included only by lazy_prefill_attention.cu.
//
// The roles' per-tile steps repeat the one-tile kernel's instead of sharing helpers with it:
// factoring the consumer's tile step into a shared inline function, with the same operations,
// changed 2059 of that kernel's 3832 instructions (ptxas), and that kernel's speed has proved
// sensitive to its code (bench/results/prefill_persistent_2026-11-28.md). A change to one
// kernel's tile step belongs in the other's too.
#pragma once

#include <cfloat>
#include <cstdint>

#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/lazy_prefill_attention.h"
#include "kernels/cuda/lazy_prefill_cta.cuh"
#include "kernels/cuda/lazy_prefill_math.cuh"
#include "kernels/cuda/lazy_prefill_query.cuh"
#include "kernels/cuda/lazy_prefill_specialized.cuh"
#include "kernels/cuda/lazy_prefill_tiles.cuh"
#include "kernels/cuda/lazy_prefill_work_starts.cuh"
#include "kernels/cuda/mbarrier.cuh"
#include "kernels/cuda/prefill_timeline.cuh"
#include "kernels/cuda/tma.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace lazykv::cuda {
namespace {

// After a loop whose exit the compiler cannot prove warp-uniform (it depends on shared
// memory), a counter carried on (*counter, the same in every lane) is taken through a warp
// reduction, whose result ptxas keeps in a uniform register, and the warp reconverges. Without
// it the consumers' loop ran on vector registers only (48 R2UR against the one-tile kernel's
// 18, no uniform-datapath instruction against 47, 782 instructions against 701: measured 5-8%
// slower than that kernel in steady state); with it, 19, 24 and 718
// (`python3 bench/cubin_inspect.py loops`): 2-3% faster on the H200
// (bench/results/prefill_overlap_2026-11-28.md).
__device__ __forceinline__ void ReconvergeCounter(int* counter) {
  __syncwarp();
  *counter = __reduce_max_sync(0xffffffffu, *counter);
}

struct PersistentStageInfo {
  int needs_mask;
  int first_of_delta;  // wait for this delta's query buffer
  int last_of_delta;   // release the query buffer after this tile's scores
  int last;            // the work tile's last
  int final;           // the CTA's last
  int empty;           // the work tile has no visible key: no copies, its rows are written as zero
};

// The copy warpgroup (t: 0 .. 127). Tiles are counted across the CTA's work tiles (J): each
// load waits for its slot (the consumers' release of load i - 3), issues its copies, and
// arrives twice on the slot's full barrier: once its copies land (.noinc), and once to
// release its stores of the stage info and column positions. A work tile's first two
// descriptors are put in the ring by warp 0 once the work tile before it has issued its last
// loads: copied from its work start (`starts`), or made by walking its table without them (the
// CTA's first, before the split); warp 0 makes desc[J + 2] during tile J. A work tile with no
// visible key passes one empty stage (no copies) so that the consumers write its rows.
template <int HD, bool kMaps>
__device__ void RunPersistentCopyWarps(const PrefillAttentionParams& p, const WorkList& list, CtaWork w, int index,
                                       int e_hi, const PrefillWorkStart* starts, unsigned char* smem,
                                       const CUtensorMap* k_map, const CUtensorMap* v_map) {
  using L = SpecSmemLayout<HD, PersistentStageInfo>;
  const int t = threadIdx.x;
  TileDesc* desc = reinterpret_cast<TileDesc*>(smem + L::kDesc);
  PersistentStageInfo* info = reinterpret_cast<PersistentStageInfo*>(smem + L::kStage);
  int* col_pos = reinterpret_cast<int*>(smem + L::kColPos);
  SpecBarriers* bars = reinterpret_cast<SpecBarriers*>(smem + L::kBars);
  const uint32_t ring = SmemAddr(smem + L::kRing);
  const auto acquire = [&](int i) {  // load i's slot, released by the consumers after load i - 3
    if (i >= kRingSlots) mbarrier::Wait(&bars->empty[RingSlot(i)], RingParity(i) ^ 1);
  };
  const auto issue = [&](int i, const TileDesc& d, bool by_map, const void* pool, const CUtensorMap* map,
                         int* positions) {
    IssueTileLoad<HD, kMaps>(p, d, by_map, list.log2bs, w.kvh, pool, map, ring + RingSlot(i) * L::kKvBytes, positions,
                             &bars->full[RingSlot(i)], t);
  };
  // Whether a work tile follows, and where: the copy warps have few registers, so the next
  // one's fields are made (or read from its start) when it starts.
  int next_index = index + gridDim.x;
  bool more;
  if (starts != nullptr) {
    next_index = starts[index].next;
    more = next_index >= 0;
  } else {
    CtaWork probe;
    more = NextWork<HD>(p, list, &next_index, &probe);
  }
  for (int J = 0;; ++J) {
    int prev_delta = 0;
    for (int j = 0;; ++j, ++J) {
      const TileDesc& d = desc[J % kDescSlots];
      const TileDesc& dn = desc[(J + 1) % kDescSlots];
      const bool empty = !d.valid;  // the work tile has no visible key (j == 0 only)
      const bool last = empty || !dn.valid;
      const bool first_of_delta = !empty && (j == 0 || d.delta != prev_delta);
      const bool last_of_delta = !empty && (last || dn.delta != d.delta);
      prev_delta = d.delta;
      const bool by_map = kMaps && TileAtConsecutiveSlots(d);
      // Keys. info and col_pos [J & 1] were last read for tile J - 2, before the consumers
      // released V(J - 2), the load that the keys of tile J wait for.
      acquire(2 * J);
      if (t == 0) {
        LAZYKV_TIMELINE(J, kKeySlot);
        info[J & 1] =
            PersistentStageInfo{empty ? 0 : d.needs_mask, first_of_delta ? 1 : 0, last_of_delta ? 1 : 0, last ? 1 : 0,
                                last && !more ? 1 : 0,    empty ? 1 : 0};
      }
      issue(2 * J, d, by_map, p.kv.k_pool, k_map, col_pos + (J & 1) * kBN);
      if (t == 0) LAZYKV_TIMELINE(J, kKeysIssued);
      acquire(2 * J + 1);
      if (t == 0) LAZYKV_TIMELINE(J, kValueSlot);
      issue(2 * J + 1, d, by_map, p.kv.v_pool, v_map, nullptr);
      if (t == 0) LAZYKV_TIMELINE(J, kValuesIssued);
      if (last) break;
      if (t < 32) NextTile(p, dn, e_hi, w.entries_per_tile, w.pos_lo, w.pos_hi, &desc[(J + 2) % kDescSlots]);
      CopySync();  // desc[J + 2] is written; every copy warp is done with desc[J]
    }
    if (!more) return;
    ReconvergeCounter(&J);
    index = next_index;
    if (starts != nullptr) {
      // Only the fields the copy warps read (entries_per_tile is the launch's); a new use of
      // another field of w here needs it in PrefillWorkStart too.
      const PrefillWorkStart* start = starts + index;
      w.kvh = start->kvh;
      w.pos_lo = start->pos_lo;
      w.pos_hi = start->pos_hi;
      next_index = start->next;
      if (t < 32) {  // warp 0 copies the first two descriptors into the ring (one word a lane each)
        constexpr int kWords = static_cast<int>(sizeof(TileDesc) / sizeof(int));
        static_assert(kWords <= 32, "a descriptor is one word a lane");
        const int* from = reinterpret_cast<const int*>(start);
        const int first = t < kWords ? from[t] : 0, second = t < kWords ? from[kWords + t] : 0;
        e_hi = start->e_hi;
        CopySync();  // every copy warp is done with this work tile's descriptors
        if (t < kWords) {
          reinterpret_cast<int*>(&desc[(J + 1) % kDescSlots])[t] = first;
          reinterpret_cast<int*>(&desc[(J + 2) % kDescSlots])[t] = second;
        }
      } else {
        CopySync();
      }
      more = next_index >= 0;
      CopySync();  // the next work tile's first descriptors are written
    } else {
      w = WorkAt<HD>(p, list, index);
      CopySync();  // every copy warp is done with this work tile's descriptors
      if (t < 32)
        e_hi = MakeFirstTiles<HD>(p, w, list.log2bs, &desc[(J + 1) % kDescSlots], &desc[(J + 2) % kDescSlots]);
      CopySync();  // the next work tile's first descriptors are written
      next_index = index + gridDim.x;
      CtaWork probe;
      more = NextWork<HD>(p, list, &next_index, &probe);
    }
  }
}

// The rotation warpgroup (t: 0 .. 127), per work tile: R(p) q once, then for each run of the
// table's visible entries (delta k, counted across the CTA's work tiles) R(p - d) q into
// buffer k & 1, as soon as the consumers have released delta k - 2: a whole delta ahead of
// the consumers, and the next work tile's first delta is written while they finish this one.
template <int HD>
__device__ void RunPersistentRotationWarps(const PrefillAttentionParams& p, const WorkList& list, CtaWork w, int index,
                                           const CUtensorMap* q_map, unsigned char* smem) {
  using L = SpecSmemLayout<HD, PersistentStageInfo>;
  const int t = threadIdx.x - 128;
  SpecBarriers* bars = reinterpret_cast<SpecBarriers*>(smem + L::kBars);
  float* raw_q = reinterpret_cast<float*>(smem + L::kRawQ);
  unsigned char* q_buf = smem + L::kQ;
#ifdef LAZYKV_PREFILL_PROBE_QUERY_FREE  // a diagnostic build (kernels/CMakeLists.txt): no query made
  // (Zeroed once: with out_bf16 the consumers stage their rows in these buffers. Time it without.)
  for (int i = t; i < 2 * L::kQBytes / 16; i += 128) reinterpret_cast<uint4*>(q_buf)[i] = make_uint4(0, 0, 0, 0);
  wgmma::FenceProxyAsync();
  for (int k = 0;;) {
    int e = 0, e_hi = 0;
    SplitEntryRange(p, w, &e, &e_hi);
    for (; e < e_hi && __ldg(p.kv.block_starts + e) <= w.pos_hi; ++k) {
      const int delta = __ldg(p.kv.block_deltas + e);
      const int b = k & 1;
      if (k >= 2) mbarrier::Wait(&bars->q_empty[b], ((k >> 1) - 1) & 1);
      mbarrier::Arrive(&bars->q_full[b]);
      e = NextRunStart(p, e, e_hi, delta);
    }
    ReconvergeCounter(&k);
    index += gridDim.x;
    if (!NextWork<HD>(p, list, &index, &w)) return;
  }
  (void)raw_q;
#endif
  for (int k = 0, n = 0;; ++n) {  // n: the CTA's work tiles, raw_full's phases
    if (t == 0) {
      LAZYKV_TIMELINE(k, kWorkFound);
      // The work tile's rows: one box of q_map (rows past the tile's queries are another
      // sequence's or zeros; their outputs are never written).
      const long long pair = (w.q_tile - p.q) / HD;  // (query row, head) of the tile's first row
      tma::ArriveExpectBytes(&bars->raw_full, kBM * HD * 4);
      tma::Load3d(SmemAddr(raw_q), q_map, 0, static_cast<int>(pair % p.n_heads), static_cast<int>(pair / p.n_heads),
                  &bars->raw_full);
      LAZYKV_TIMELINE(k, kRawIssued);
    }
    int e = 0, e_hi = 0;
    SplitEntryRange(p, w, &e, &e_hi);
    mbarrier::Wait(&bars->raw_full, n & 1);
    if (t == 0) LAZYKV_TIMELINE(k, kRawLanded);
    RotateRowsByPosition<HD, 128, kBM>(p, raw_q, 0, w.pos_lo, t, w.log2_pack);
    RotationSync();  // the rotations by delta read the tile with another split
    if (t == 0) LAZYKV_TIMELINE(k, kPositionDone);
    for (; e < e_hi && __ldg(p.kv.block_starts + e) <= w.pos_hi; ++k) {
      const int delta = __ldg(p.kv.block_deltas + e);
      const int b = k & 1;
      if (k >= 2) mbarrier::Wait(&bars->q_empty[b], ((k >> 1) - 1) & 1);
      if (t == 0) LAZYKV_TIMELINE(k, kBufferFree);
      WriteQueryForDelta<HD>(p, raw_q, delta, t, SmemAddr(q_buf + b * L::kQBytes));
      wgmma::FenceProxyAsync();  // the rows, read next by wgmma (async proxy)
      mbarrier::Arrive(&bars->q_full[b]);
      if (t == 0) LAZYKV_TIMELINE(k, kQueryWritten);
      e = NextRunStart(p, e, e_hi, delta);
    }
    ReconvergeCounter(&k);
    index += gridDim.x;
    if (!NextWork<HD>(p, list, &index, &w)) return;
    // Every thread's generic accesses to the raw rows (reads, and writes where it rotated them by
    // position) are ordered before the copy engine's writes of the next work tile's rows.
    wgmma::FenceProxyAsync();
    RotationSync();  // every thread is done with the raw rows before the next work tile's land
  }
}

// Consumer c (0 or 1): query rows 64 c .. 64 c + 63 of each of the CTA's work tiles.
template <int HD>
__device__ void RunPersistentConsumer(const PrefillAttentionParams& p, const WorkList& list, CtaWork w, int index,
                                      float scale_log2, const CUtensorMap& out_map, unsigned char* smem) {
  using L = SpecSmemLayout<HD, PersistentStageInfo>;
  const int c = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 128), 0) - 2;  // warp-uniform to ptxas
  const int my_row0 = c * 64 + ((threadIdx.x % 128) / 32) * kRowsPerWarp + (threadIdx.x % 32) / 4;
  const PersistentStageInfo* info = reinterpret_cast<const PersistentStageInfo*>(smem + L::kStage);
  const int* col_pos = reinterpret_cast<const int*>(smem + L::kColPos);
  SpecBarriers* bars = reinterpret_cast<SpecBarriers*>(smem + L::kBars);
  const uint32_t q_half = SmemAddr(smem + L::kQ) + c * 64 * 128;  // this consumer's half of buffer 0
  const uint32_t ring = SmemAddr(smem + L::kRing);

  int k = -1;  // the delta's index, across work tiles
#ifdef LAZYKV_PREFILL_PROBE_OUT_FREE
  const bool stage_output = false;
#else
  // The bf16 output goes through the work tile's last query buffer (released after it).
  const bool stage_output = p.out_bf16 != nullptr && list.splits == 1;
#endif
  for (int J = 0;; ++J) {
    float o[HD / 2];
#pragma unroll
    for (int i = 0; i < HD / 2; ++i) o[i] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    const int row_pos[2] = {RowPosition(w, my_row0), RowPosition(w, my_row0 + 8)};
    if (c == 0 && threadIdx.x % 128 == 0) TimelineStampValue(J, kWorkIndex, index + 1);
    bool empty = false;
    for (;; ++J) {
      const int ks = RingSlot(2 * J), vs = RingSlot(2 * J + 1);
      mbarrier::Wait(&bars->full[ks], RingParity(2 * J));
      const PersistentStageInfo in = info[J & 1];
      if (c == 0 && threadIdx.x % 128 == 0) LAZYKV_TIMELINE(J, kKeysLanded);
      if (in.empty) {  // no visible key: no scores, but the turns and the slots go on
        if (c == 1 || J > 0) TurnSync(c);
        if (c == 0 || !in.final) TurnArrive(1 - c);
        mbarrier::Arrive(&bars->empty[ks]);
        mbarrier::Wait(&bars->full[vs], RingParity(2 * J + 1));
        mbarrier::Arrive(&bars->empty[vs]);
        empty = true;
        break;
      }
      if (in.first_of_delta) {
        ++k;
        mbarrier::Wait(&bars->q_full[k & 1], (k >> 1) & 1);
      }
      const bool stamps = threadIdx.x % 128 == 0;  // one thread of the consumer (diagnostic builds)
      if (stamps) LAZYKV_TIMELINE(J, 5 * c + kKeysReady);
      wgmma::FenceProxyAsync();  // the keys' cp.async copies (and the query rows), read next by wgmma
      float s[kBN / 2];
      if (c == 1 || J > 0) TurnSync(c);
      if (stamps) LAZYKV_TIMELINE(J, 5 * c + kTurn);
      IssueScores<HD>(s, q_half + (__shfl_sync(0xffffffffu, k, 0) & 1) * L::kQBytes, ring + ks * L::kKvBytes);
      wgmma::Wait<0>();
      wgmma::PinRegisters(s);
      if (stamps) LAZYKV_TIMELINE(J, 5 * c + kScoresDone);
      if (c == 0 || !in.final) TurnArrive(1 - c);  // consumer 0 takes no turn after the CTA's last tile
      mbarrier::Arrive(&bars->empty[ks]);
      // The work tile's last query buffer: released after the output went through it.
      if (in.last_of_delta && !(in.last && stage_output)) mbarrier::Arrive(&bars->q_empty[k & 1]);

      SoftmaxAndIssueValues<HD>(s, o, m, l, col_pos + (J & 1) * kBN, in.needs_mask, row_pos, scale_log2,
                                ring + vs * L::kKvBytes, [&] {
                                  if (stamps) LAZYKV_TIMELINE(J, 5 * c + kSoftmaxDone);  // its first half
                                  mbarrier::Wait(&bars->full[vs], RingParity(2 * J + 1));
                                  wgmma::FenceProxyAsync();  // the values' copies
                                });
      wgmma::Wait<0>();
      wgmma::PinRegisters(o);
      if (stamps) LAZYKV_TIMELINE(J, 5 * c + kValuesDone);
      mbarrier::Arrive(&bars->empty[vs]);
      if (in.last) break;
    }
#ifdef LAZYKV_PREFILL_PROBE_OUT_FREE  // a diagnostic build (kernels/CMakeLists.txt): no output written
    if (J < 0) WriteRows<HD>(p, w, o, m, l, my_row0, scale_log2);  // never: keeps the work tile's products
#else
    if (empty) {  // (unsplit, only for a table without the query's own keys)
      if (stage_output) {
        WriteEmptyRowsBf16<HD>(p, w, threadIdx.x - 256, 256);
      } else {
        WriteEmptyRows<HD>(p, w, threadIdx.x - 256, 256);
      }
    } else if (stage_output) {
      // The rows go through this consumer's half of the last query buffer, which only this
      // consumer read (its scores are done), into two TMA boxes (one a 128-byte column block of
      // its 64 rows) that one thread stores. The consumers' own stores, issued as the next work
      // tile's first keys were on their way, held those keys longer: from the last P V to the
      // keys landed ~4000 cycles against ~3300 with the boxes, ~1800 with no output at all
      // (bench/results/prefill_epilogue_2026-11-29.md). Where the boxes would write rows past
      // the tile's (another sequence's), the consumer stores the rows itself.
      const uint32_t tile = SmemAddr(smem + L::kQ) + (__shfl_sync(0xffffffffu, k, 0) & 1) * L::kQBytes;
      StageRowsBf16<HD>(o, l, my_row0, tile);
      if (c * 64 + 64 <= w.rows) {
        wgmma::FenceProxyAsync();  // the staged rows, read next by the copy engine (async proxy)
        ConsumerSync(c);
        if (threadIdx.x % 128 == 0) {
          const long long pair = (w.out_tile - p.out) / HD + RowPair(w, c * 64);  // (query row, head)
#pragma unroll
          for (int b = 0; b < HD / 64; ++b) {
            tma::Store3d(&out_map, 64 * b, static_cast<int>(pair % p.n_heads), static_cast<int>(pair / p.n_heads),
                         tile + b * (kBM * 128) + c * 64 * 128);
          }
          tma::CommitGroup();
          tma::WaitGroupsRead();  // before the buffer goes back to the rotation warps
        }
      } else {
        ConsumerSync(c);
        StoreStagedRowsBf16<HD>(p, w, c * 64, tile, threadIdx.x % 128, 128);
      }
      mbarrier::Arrive(&bars->q_empty[k & 1]);  // the work tile's last delta (its last tile's release)
    } else {
      WriteRows<HD>(p, w, o, m, l, my_row0, scale_log2);
    }
#endif
    if (c == 0 && threadIdx.x % 128 == 0) LAZYKV_TIMELINE(J, kOutputHandedOff);
    ReconvergeCounter(&J);
    index += gridDim.x;
    if (!NextWork<HD>(p, list, &index, &w)) {
      if (threadIdx.x % 128 == 0) tma::WaitGroups();  // the CTA's last rows written before it ends
      return;
    }
  }
}

// grid: gridDim.x CTAs over `list`, at most one an SM.
template <int HD>
__global__ void __launch_bounds__(kSpecThreads, 1)
    LazyPrefillPersistentKernel(const PrefillAttentionParams p, const WorkList list, float scale_log2,
                                const PrefillWorkStart* starts, const __grid_constant__ CUtensorMap q_map,
                                const __grid_constant__ CUtensorMap out_map, const __grid_constant__ CUtensorMap k_map,
                                const __grid_constant__ CUtensorMap v_map, int kv_maps) {
  AllowDependentLaunch();  // launched by LaunchDependent (dependent_launch.cuh): the combine may come in
  using L = SpecSmemLayout<HD, PersistentStageInfo>;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - (SmemAddr(smem_raw) & 1023)) & 1023);
  // Until WaitForPriorGrid, only the launch's tables are read (the header's contract): the walk
  // of the block table and the first tiles' requests to L2 overlap the kernel before this one.
  int index = blockIdx.x;
  CtaWork w;
  if (!NextWork<HD>(p, list, &index, &w)) return;  // every thread finds the same: no work tile
  TileDesc* desc = reinterpret_cast<TileDesc*>(smem + L::kDesc);
  int e_hi = 0;
  if (threadIdx.x < 32) e_hi = MakeFirstTiles<HD>(p, w, list.log2bs, &desc[0], &desc[1]);  // copy warp 0
  if (threadIdx.x == 0) {
    SpecBarriers* bars = reinterpret_cast<SpecBarriers*>(smem + L::kBars);
    InitSpecBarriers(bars);
    mbarrier::Init(&bars->raw_full, 1);  // the rotation thread that expects the rows' bytes
  }
  WaitForPriorGrid();  // before anything an earlier kernel wrote (the queries, the new keys) is read
  __syncthreads();
  LAZYKV_TIMELINE_CTA_START();
  if (threadIdx.x < 128) {
    ShrinkRegisters<kCopyRegs>();
    if (kv_maps) {
      RunPersistentCopyWarps<HD, true>(p, list, w, index, e_hi, starts, smem, &k_map, &v_map);
    } else {
      RunPersistentCopyWarps<HD, false>(p, list, w, index, e_hi, starts, smem, nullptr, nullptr);
    }
  } else if (threadIdx.x < 256) {
    ShrinkRegisters<kRotationRegs>();
    RunPersistentRotationWarps<HD>(p, list, w, index, &q_map, smem);
  } else {
    GrowRegisters<kConsumerRegs>();
    RunPersistentConsumer<HD>(p, list, w, index, scale_log2, out_map, smem);
  }
}

}  // namespace
}  // namespace lazykv::cuda
