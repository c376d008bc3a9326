// An in-kernel timeline of the one-tile and persistent lazy prefill kernels (a diagnostic build
// only; the persistent kernel numbers a CTA's tiles across its work tiles): one
// thread of each role writes the SM's cycle counter at each step of each KV tile, so that the
// consumers' and the copies' steps can be laid side by side (bench/prefill_timeline.py). Built
// in only with -DLAZYKV_PREFILL_TIMELINE=ON (CMake), which defines the macro for
// lazy_prefill_attention.cu alone; otherwise every stamp is nothing and the kernel is unchanged.
// Included only by lazy_prefill_attention.cu.
#pragma once

#include <cstdint>

#include "kernels/cuda/lazy_prefill_attention.h"

namespace lazykv::cuda {
namespace {

// Stamps per (CTA, tile): [ctas][tiles][detail::kPrefillTimelineEvents]; the first CTAs of
// the grid (in launch order) up to max_ctas, tiles up to max_tiles. Events: see
// PrefillTimelineEvent.
enum PrefillTimelineEvent {
  // Consumer c's, at 5 c + e: its keys have landed; its turn; its scores are done; its softmax
  // is done; its P V is done.
  kKeysReady = 0,
  kTurn = 1,
  kScoresDone = 2,
  kSoftmaxDone = 3,
  kValuesDone = 4,
  // The copy warps' (thread 0): the key slot is free; the keys are issued; the value slot is
  // free; the values are issued.
  kKeySlot = 10,
  kKeysIssued = 11,
  kValueSlot = 12,
  kValuesIssued = 13,
  kCtaStart = 14,  // tile 0 only: the CTA's start; event 15 of tile 0: its SM
  kSmId = 15,
  // Tile 0 only: the rotation warps (thread 0 of the role) have seen the consumers' first query
  // (MakeFirstQuery) made.
  kFirstQueryMade = 16,
  // The persistent kernel only. Consumer 0's keys have landed (before it waits for a new delta's
  // query; kKeysReady is after both); at a work tile's first tile, the work tile's list index + 1
  // (a value, not a time).
  kKeysLanded = 17,
  kWorkIndex = 18,
  // The rotation warps' (thread 0), stamped at "tile" k, the CTA's delta index: for a work tile's
  // first delta, its raw rows have landed and R(position) q is made; for every delta, the wait for
  // its query buffer has passed and its query is written.
  kRawLanded = 19,
  kPositionDone = 20,
  kBufferFree = 21,
  kQueryWritten = 22,
  // The rotation warps', at a work tile's first delta k: its work tile found (NextWork), and its
  // raw rows' copies issued.
  kWorkFound = 23,
  kRawIssued = 24,
  // The persistent kernel's consumer 0, at a work tile's last tile: its rows are handed off (its
  // own stores issued, or the TMA boxes' shared memory read; their global writes may go on).
  kOutputHandedOff = 25,
  // Tile 0 only, the one-tile kernel (a short CTA's fixed path, e.g. a question's split): thread 0
  // at the kernel's entry (cycles, and the GPU's global timer in ns, comparable across SMs), after
  // its wait for the kernel before (WaitForPriorGrid); consumer 0's first thread once its rows are
  // written (cycles, ns).
  kEntry = 26,
  kEntryNs = 27,
  kPriorGridDone = 28,
  kRowsWritten = 29,
  kRowsWrittenNs = 30,
  // Tile 0 only, the one-tile kernel's thread 0: its work tile made (MakeCtaWork); its first two
  // tiles made or read (before the wait, or after it where the starts were just made); the copy
  // warps' start (past the CTA barrier and their register split).
  kWorkMade = 31,
  kFirstTilesMade = 32,
  kCopyStart = 33,
};
static_assert(kCopyStart < detail::kPrefillTimelineEvents, "an event past the stamps of a tile");

#ifdef LAZYKV_PREFILL_TIMELINE
struct PrefillTimeline {
  long long* stamps = nullptr;
  int max_ctas = 0;
  int max_tiles = 0;
};
// Constant memory: a stamp reads it from the constant cache, not with a round trip to L2,
// which delayed the stamping thread (and its role) by the latency of a global load.
__constant__ PrefillTimeline g_prefill_timeline;

__device__ __forceinline__ void TimelineStamp(int tile, int event, long long value) {
  const PrefillTimeline t = g_prefill_timeline;
  const int cta = static_cast<int>(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z));
  if (t.stamps == nullptr || cta >= t.max_ctas || tile >= t.max_tiles) return;
  t.stamps[(static_cast<long long>(cta) * t.max_tiles + tile) * detail::kPrefillTimelineEvents + event] = value;
}
__device__ __forceinline__ long long SmId() {
  unsigned id;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
  return id;
}
__device__ __forceinline__ long long GlobalNs() {
  unsigned long long ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  return static_cast<long long>(ns);
}
// The calling thread's stamp (call it from one thread of the role).
#define LAZYKV_TIMELINE(tile, event) TimelineStamp((tile), (event), clock64())
#define LAZYKV_TIMELINE_NS(tile, event) TimelineStamp((tile), (event), GlobalNs())
#define TimelineStampValue(tile, event, value) TimelineStamp((tile), (event), (value))
#define LAZYKV_TIMELINE_CTA_START()           \
  do {                                        \
    if (threadIdx.x == 0) {                   \
      TimelineStamp(0, kCtaStart, clock64()); \
      TimelineStamp(0, kSmId, SmId());        \
    }                                         \
  } while (0)
#else
#define LAZYKV_TIMELINE(tile, event) ((void)0)
#define LAZYKV_TIMELINE_NS(tile, event) ((void)0)
#define TimelineStampValue(tile, event, value) ((void)0)
#define LAZYKV_TIMELINE_CTA_START() ((void)0)
#endif

}  // namespace
}  // namespace lazykv::cuda
