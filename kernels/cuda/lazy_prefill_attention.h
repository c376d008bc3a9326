// Lazy-RoPE paged prefill attention on the GPU (DESIGN.md section 2): a batch of
// sequences, each with a run of new query tokens at logical positions [pos0, pos0 + n),
// against that sequence's paged bf16 KV (chunk blocks with their rotation deltas, fully
// visible where they precede the query, and the request's own blocks, delta 0, causal).
// The keys of the new tokens are in the pool before the call.
//
// A query at position p scores a stored key of a block with delta d as <R(p - d) q, k>.
// The kernel is a tiled online softmax (FlashAttention style) on Hopper's warpgroup
// tensor-core instructions (wgmma, bf16 operands, fp32 accumulation). Each CTA holds a
// tile of 128 query rows (128 queries of one head, or, for short query runs, fewer queries of
// several heads of one KV group: pack_heads); its query tile is rotated once per run of KV tiles that share a
// delta (a KV tile never spans two deltas), in fp32 with a precise angle, then rounded
// once to bf16 for the tensor cores. Keys are never rotated or copied. By default one warpgroup
// copies the KV tiles and another rotates the query, a delta ahead, while two consumer
// warpgroups compute (lazy_prefill_specialized.cuh).
//
// Precision: q is read as fp32 and rotated in fp32; the rotated q and the softmax
// probabilities enter the tensor cores as bf16 (one rounding each); scores, softmax and
// the output accumulate in fp32. The CPU twin is kernels/cpu/paged_attention.h.
//
// Ordering: the kernels are dependent launches (dependent_launch.cuh) that read the block
// table (kv's table arrays), query_offsets and query_pos0 *before* they wait for the kernel
// before them, so that their walk of the table overlaps it (and ask L2 for their first tiles'
// keys and values, a hint that no write can make stale). Those arrays must therefore be
// uploaded by a copy on the stream (or earlier) and written by no kernel on the stream since,
// as the backend uploads a step's tables before the step's first kernel. q is read, and the
// pools and outputs are read or written, only after the wait (the pools get only the L2 hint
// before it). The one-tile kernel also reads work_starts before the wait where they were made by
// an earlier launch (work_starts_made: that field's contract). A CTA whose query tile is empty
// returns before the wait, so at least one CTA must have queries (max_queries_per_seq must be
// the largest of query_offsets' runs, as the launcher assumes): otherwise the launch could end
// before the kernel before it.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/paged_kv.h"

namespace lazykv::cuda {

// Device pointers. The pool and its block table are in `kv` (paged_kv.h: the block table's
// contract); the pools are bf16 here (the generic kernel takes fp32 too).
struct PrefillAttentionParams {
  // [total_queries][n_heads][head_dim] fp32, raw (unrotated) unless q_rotated. Sequence s owns
  // rows [query_offsets[s], query_offsets[s + 1]); its row i sits at position query_pos0[s] + i.
  const float* q = nullptr;
  // n_heads % kv.n_kv_heads == 0 (any group size); kv.head_dim 64 or 128; kv.block_size a
  // power of two, at least 16.
  PagedKv kv;
  const int32_t* query_offsets = nullptr;  // [num_seqs + 1]
  const int32_t* query_pos0 = nullptr;     // [num_seqs]
  float* out = nullptr;                    // [total_queries][n_heads][head_dim] fp32
  // Split-KV: when a launch would not fill the GPU (few sequences, heads and query tiles),
  // the visible keys are cut into splits whose partials are merged by a second kernel.
  // It needs PrefillWorkspaceBytes(p, ChoosePrefillSplits(p)) bytes here; with no
  // workspace the kernel runs unsplit.
  float* workspace = nullptr;
  // The work starts of the persistent and the one-tile kernels: PrefillWorkStartsBytes(p) bytes,
  // written by a small kernel launched before them (each work tile's entry range, first two
  // tiles and next work tile), so that the persistent kernel's copy warps read a work tile's
  // start in one round of loads where they otherwise walk its block table at the boundary, and
  // a one-tile CTA reads its first tiles instead of searching its split's entry range (a short
  // question's CTA spent ~4 us of ~13 there: bench/results/question_start_2026-11-29.md).
  // Optional; unused by the two-warpgroup kernels.
  void* work_starts = nullptr;
  int num_seqs = 0;
  int n_heads = 0;
  int max_queries_per_seq = 0;  // max over s of query_offsets[s + 1] - query_offsets[s]
  int num_splits = 0;           // 0: chosen from the GPU's SM count; 1: never split
  // Query heads of one KV group that share a CTA's tile of 128 rows (row r: query r / pack,
  // head r % pack of the CTA's heads), so the CTA reads each KV tile once for all of them.
  // 0: chosen (packed as far as the kernel allows when a sequence has at most 64 queries,
  // where an unpacked tile would be at most half full; short questions over cached
  // documents); 1: never; else a power of two that divides the group, at most
  // MaxPrefillPack(head_dim) (the default schedule only).
  int pack_heads = 0;
  // A hint: the most keys any query sees (its position + 1, over the launch; 0: not known).
  // Where every query sees few keys and the launch spans several waves, the launcher takes the
  // persistent kernel (ChoosePrefillSchedule), whose CTAs overlap one work tile's short KV loop
  // with the next one's start.
  int max_keys = 0;
  // True where work_starts already holds this launch's starts: an earlier launch on the same
  // stream with the same tables, queries and shape made them (a step's later layers, whose
  // launches differ only in the pools) on the same kernel (the persistent and the one-tile
  // kernels lay their starts out differently), so their small kernel is not launched again. The
  // one-tile kernel then reads them before it waits for the kernel before it, so the kernel that
  // made them must have completed before the kernel before this launch began: some kernel
  // between the two launches must start its successor only as it ends, after its own wait (a
  // dependent launch that starts its successor at once, as the prefill kernels and their combine
  // do, passes the ordering on by one kernel). In the backend a layer's GEMMs are such kernels
  // (the skinny kernels do not start their successors early, cuBLASLt's are ordinary launches).
  // (Last, so that the kernels' parameter offsets stay as they were.)
  bool work_starts_made = false;
  // True where q holds R(position) q, each row already rotated at its own position (the KV
  // write does it: KvWriteParams::q_positions), so that the kernels only rotate by -delta; a
  // work tile's rotation by position had been on the persistent kernel's path at every work
  // tile's start (bench/results/prefill_query_2026-11-29.md).
  bool q_rotated = false;
  // q's rows (query_offsets[num_seqs]); 0: not known. The persistent kernel reads its query rows
  // through a tensor map over them (query_tensor_map.h), so the default launch takes it only
  // where this is known.
  int total_queries = 0;
  // Optional: [total_queries][n_heads][head_dim] bf16. Where set, the launch also leaves its
  // output rounded once to bf16 here (to nearest even: LaunchToBf16's rounding of `out`, bit for
  // bit), for a bf16 output GEMM; `out` is then scratch, and may be left unwritten: the unsplit
  // persistent and one-tile kernels write only this (PrefillWritesBf16; the persistent kernel's
  // fp32 stores at every work tile's end held causal 1k back 15%:
  // bench/results/prefill_epilogue_2026-11-29.md); the other launches write `out` and convert it
  // after them. Needs total_queries (all rows: the rows are not bounds-checked against it),
  // 16-byte alignment, and no overlap with `out`.
  void* out_bf16 = nullptr;
  // The fewest work tiles for which the default launch takes the persistent kernel
  // (ChoosePrefillSchedule); 0: two an SM. Tests set 1 so that small models take it.
  int persistent_min_work_tiles = 0;
};

// The most query heads a tile packs: the rotation warpgroup's rows per step (512 / head_dim).
constexpr int MaxPrefillPack(int head_dim) { return 512 / head_dim; }

// The heads per tile the default launch uses for these shapes (pack_heads resolved). Packing
// (pack_heads 0) takes more than one only where every sequence has at most
// kPrefillPackMaxQueries queries (an unpacked tile would be at most half full), so a caller with
// few-query sequences beside longer ones gains from two launches.
constexpr int kPrefillPackMaxQueries = 64;
int ChoosePrefillPack(const PrefillAttentionParams& p);

// Splits the launcher will use for these shapes on the current device (given a workspace);
// a launch of another schedule uses no more.
int ChoosePrefillSplits(const PrefillAttentionParams& p);
size_t PrefillWorkspaceBytes(const PrefillAttentionParams& p, int num_splits);
// The bytes PrefillAttentionParams::work_starts needs for these shapes: a record for each of the
// persistent kernel's work tiles (unsplit), or of the one-tile kernel's CTAs (as split by
// ChoosePrefillSplits, which follows the current device's SM count: size the buffer on the
// device that launches). Host code.
size_t PrefillWorkStartsBytes(const PrefillAttentionParams& p);

// Validates the shapes and launches; errors come back as cudaError_t
// (cudaErrorInvalidValue for shapes the kernel does not support, checked before any
// CUDA call, so it needs no GPU).
cudaError_t LaunchLazyPrefillAttention(const PrefillAttentionParams& p, cudaStream_t stream);

// Whether the default launch takes the persistent kernel (the launch's own choice: the SM count,
// LAZYKV_PREFILL_PERSISTENT; host code). A caller that wants the output in bf16 asks with
// out_bf16 set (a long prefill takes the persistent kernel only then); whether the launch then
// writes it itself, PrefillWritesBf16 says. Two things gain only there:
// - a query rotated at its positions (q_rotated): the persistent kernel's rotation warps
//   otherwise rotate each work tile's query by position on the path to its first tile
//   (1.09-1.12x at 1k keys); elsewhere the KV write's rotation (~2.2 us a layer of a 16-row step)
//   would only cost (bench/results/prefill_query_2026-11-29.md);
// - asking for out_bf16 changes the choice for a long prefill (ChoosePrefillSchedule).
bool PrefillTakesPersistentKernel(const PrefillAttentionParams& p);

// Whether the default launch writes p.out_bf16 itself, given a workspace for
// ChoosePrefillSplits(p) splits, as the backend gives one (host code): its kernel, the one-tile
// or the persistent one, unsplit. (Without a workspace a launch is unsplit, so it writes bf16
// wherever its kernel is one of those two, even where this says false.) Elsewhere the launcher
// converts `out` after the kernel (a split launch's combine writes fp32), which a caller that
// converts other rows too may do itself in one kernel (clearing out_bf16, which may change the
// kernel: ask PrefillTakesPersistentKernel after). Either way the bf16 output is `out`'s
// rounding, bit for bit.
bool PrefillWritesBf16(const PrefillAttentionParams& p);

namespace detail {
// For the benchmark and the tests: the launch with a given kernel and schedule of its main
// loop (lazy_prefill_tiles.cuh: 0 two warpgroups, serial; 1 two warpgroups, staggered; 2 a
// copy, rotation and two consumer warpgroups, a CTA per work tile; 3 the same kernel
// persistent, at most max_ctas CTAs (0: one an SM), each taking many work tiles; it needs
// QueryTensorMapSupported(p), else cudaErrorInvalidValue).
constexpr int kNumPrefillSchedules = 4;
constexpr int kSpecializedSchedule = 2;
constexpr int kPersistentSchedule = 3;
// The schedule the default launch takes on a GPU of `sms` SMs: the persistent kernel (3) when
// p.max_keys is known, the queries can be read through a tensor map (QueryTensorMapSupported),
// the launch is unsplit with at least two work tiles an SM (or p.persistent_min_work_tiles where
// set), and either every KV loop is short
// (p.max_keys at most max_keys) or the launch is a long prefill of its own rows (the longest
// sequence's queries at least a quarter of p.max_keys, and p.max_keys at most
// kLongPrefillMaxKeys) that wants its output in bf16 (p.out_bf16); else 2. Host code (no CUDA call).
// - Why short loops: the persistent kernel hides each work tile's start and end; with its work
//   starts it wins full causal prefill at 2k keys by 3.5% but loses the last 512 queries of 2k by
//   ~1% (fp32 output, bench/results/prefill_order_2026-11-28.md).
// - Why long prefill in bf16, up to 8k keys: where both kernels write the bf16 output themselves,
//   the persistent kernel wins full rows 1.45x at 1k, 1.25x at 2k, 1.10x at 4k and 1.02x at 8k,
//   and loses 0.98x at 16k; it wins the last 512 queries of 2k 1.02x and loses those of 4k
//   0.96x, hence a quarter (with an fp32 output it is 0.97x at 4k-16k;
//   bench/results/prefill_softmax_2026-11-29.md, prefill_schedule_2026-11-29.md).
// - Why not every long loop: a lazy step's launches mix documents' rows with questions' long KV
//   loops over cached documents; taking the persistent kernel there slowed the Zipf trace's lazy
//   steps 1-4% (the question tiles' longer loop, and a static work split that a few heavy tiles
//   unbalance: bench/results/prefill_schedule_2026-11-29.md).
// The rule sees the launch's maxima only: a launch with a long prefill of its own rows beside
// another sequence's long loop over under a quarter as many queries takes the persistent kernel too.
// The backend's launches rarely do (it launches sequences of at most kPrefillPackMaxQueries
// apart).
constexpr int kPersistentMaxKeys = 1024;
constexpr int kLongPrefillMaxKeys = 8192;
int ChoosePrefillSchedule(const PrefillAttentionParams& p, int sms, int max_keys = kPersistentMaxKeys);
cudaError_t LaunchLazyPrefillAttentionVariant(const PrefillAttentionParams& p, int schedule, cudaStream_t stream,
                                              int max_ctas = 0);
// Diagnostic builds (CMake -DLAZYKV_PREFILL_TIMELINE=ON): later launches of the one-tile and
// persistent kernels (schedules 2 and 3; the persistent kernel's tiles are numbered across a
// CTA's work tiles) write an in-kernel timeline into `stamps`, int64
// [max_ctas][max_tiles][kPrefillTimelineEvents] (prefill_timeline.cuh says which stamp is
// which); null stops it. cudaErrorNotSupported in other builds. Not thread-safe with launches
// in flight.
constexpr int kPrefillTimelineEvents = 34;
cudaError_t SetPrefillTimeline(long long* stamps, int max_ctas, int max_tiles);
// "copy_only", "math_only", "query_free" or "out_free" in a probe build (CMake -DLAZYKV_PREFILL_PROBE=...; its outputs
// are wrong, its times bound the kernels), nullptr otherwise.
const char* PrefillProbeName();
}  // namespace detail

}  // namespace lazykv::cuda
