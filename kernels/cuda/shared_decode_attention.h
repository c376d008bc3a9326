// Chunk-shared lazy decode attention (DESIGN.md section 2; issue 25): one query token per
// sequence, as LaunchLazyDecodeAttention (lazy_decode_attention.h) computes it, but the block
// runs that several sequences reference (a document's chunk, each sequence at its own delta)
// are read once per step for all of them. A host plan (shared_decode_plan.h) splits the batch's
// block tables into work items (a run of shared blocks and its members: (sequence, delta)) and
// a residual table of each sequence's other entries. Three launches on one stream:
//  1. the shared kernel (shared_decode_kernel.cuh): one CTA per (work item, KV head) streams the
//     item's K/V tiles once through shared memory and computes, on tensor cores, the scores of
//     every (member, query head of the GQA group) row, each member's query rotated by its own
//     (position - delta); it leaves one partial softmax state per (member, head);
//  2. the per-sequence split decode kernel (lazy_decode_kernels.cuh) over the residual table,
//     leaving `residual_splits` partial states per (sequence, head); with the planner's solo
//     items (an option, off in SharedDecodeOptionsFor) the residual holds only the entries a
//     query does not wholly see, so in decode it is usually empty and this launch is skipped;
//  3. a combine that merges, per (sequence, head), its shared parts and residual splits
//     (softmax_merge.cuh) into the output.
//
// Precision: the rotated query and the probabilities enter the tensor cores as bf16, with fp32
// accumulation, as in the lazy prefill kernel and FlashAttention, so the result equals the
// per-sequence kernel's (fp32 query, fp32 probabilities against the same bf16 K/V) within one
// bf16 step of the largest output (measured up to 6.4e-3 of it; the test allows 1.6e-2). kernel_variant
// kSharedKernelExact feeds both as bf16 hi + lo pairs (about 16 significant bits): about 1e-5
// relative (the test allows 1e-4), at 2 CTAs an SM instead of 3.
//
// Shapes: bf16 pools, head_dim 64 or 128, n_heads / n_kv_heads at most 8 (as the per-sequence
// kernel); at most kSharedMaxRows / group members and kSharedMaxEntries entries per work item
// (SharedDecodeOptionsFor gives planner options that respect them).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/lazy_decode_attention.h"
#include "kernels/cuda/shared_decode_plan.h"

namespace lazykv::cuda {

constexpr int kSharedMaxRows = 64;     // (member, head) rows per work item: 4 warps of 16
constexpr int kSharedMaxEntries = 64;  // block-table entries per work item

// Device pointers. `base` is the per-sequence kernel's parameters over the full block table
// (q, kv, positions, out, num_seqs, n_heads); its workspace, splits and split_counters are not
// used (the residual kernel never merges its own splits: the combine does).
struct SharedDecodeParams {
  DecodeAttentionParams base;
  // The plan, uploaded as is (shared_decode_plan.h).
  const SharedWorkItem* items = nullptr;
  const SharedMember* members = nullptr;
  const int32_t* shared_parts = nullptr;  // [num_seqs]
  int num_items = 0;
  int max_shared_parts = 0;
  // The residual table (same pool): paged_kv.h's block-table fields.
  const int32_t* res_block_ids = nullptr;
  const int32_t* res_block_tokens = nullptr;
  const int32_t* res_block_deltas = nullptr;
  const int32_t* res_block_starts = nullptr;
  const int32_t* res_offsets = nullptr;  // [num_seqs + 1]
  int max_residual_entries = 0;
  int residual_splits = 0;     // 0: as the per-sequence kernel would split the residual (>= 2)
  float* workspace = nullptr;  // SharedDecodeWorkspaceBytes()
  // Tuning of the shared kernel (0: the default; kSharedKernelExact): the others are the
  // alternatives that shared_decode_bench times in the same run (SharedKernelVariantName).
  int kernel_variant = 0;
  // Optional: a second stream and two events (cudaEventDisableTiming) on which the residual
  // kernel runs beside the shared kernel, forked from and joined back into the launch's
  // stream before the combine (both are latency-bound: either fills the other's idle SMs).
  // All three or none; used by one launch at a time. base.new_tokens is ignored (the
  // residual kernel only reads: a KV write runs before).
  cudaStream_t residual_stream = nullptr;
  cudaEvent_t fork = nullptr;
  cudaEvent_t join = nullptr;
};

// The shared kernel's variants: 0 the default (the query and P rounded once to bf16), 1 the
// exact one (both as bf16 hi + lo pairs), the others measured beside them; names for the
// benchmark's table; the largest error against the per-sequence kernel, relative to the largest
// output, that a variant's arithmetic allows (1e-4 with the pairs, two bf16 steps, 1.6e-2, where
// P or the query is one bf16 value).
constexpr int kSharedKernelVariants = 4;
constexpr int kSharedKernelExact = 1;
const char* SharedKernelVariantName(int variant);
double SharedKernelVariantTolerance(int variant);

// Planner options that fit the kernel for this head grouping: members per item up to
// kSharedMaxRows / group (and at most 16), entries per item about 512 tokens' worth (at most
// kSharedMaxEntries), solo items off.
SharedDecodePlanOptions SharedDecodeOptionsFor(int n_heads, int n_kv_heads, int block_size);

// The residual splits the launcher uses (p.residual_splits, or its choice).
int SharedResidualSplits(const SharedDecodeParams& p);
size_t SharedDecodeWorkspaceBytes(const SharedDecodeParams& p);

// Validates the shapes and launches the three kernels on `stream`; errors come back as
// cudaError_t (cudaErrorInvalidValue for shapes the kernels do not support).
cudaError_t LaunchSharedDecodeAttention(const SharedDecodeParams& p, cudaStream_t stream);

}  // namespace lazykv::cuda
