// Lazy-RoPE paged decode attention on the GPU (DESIGN.md section 2): one query token
// per sequence against its paged bf16 KV, split over the KV length (flash-decoding) so
// that a batch of one with a long context still fills the GPU. The query is rotated by
// (position - delta) whenever the block table's delta changes; keys are never touched.
// The CPU twin is kernels/cpu/paged_attention.h (LazyPagedAttention).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/lazy_prefill_attention.h"
#include "kernels/cuda/paged_kv.h"

namespace lazykv::cuda {

// Device pointers. The pool and its block table are in `kv` (paged_kv.h); the pools are
// bf16, kv.head_dim 64 or 128, n_heads / kv.n_kv_heads at most 8.
struct DecodeAttentionParams {
  const float* q = nullptr;  // [num_seqs][n_heads][head_dim], raw (unrotated)
  PagedKv kv;
  const int32_t* positions = nullptr;  // [num_seqs]: the query's logical position
  float* out = nullptr;                // [num_seqs][n_heads][head_dim]
  float* workspace = nullptr;          // DecodeWorkspaceBytes()
  int num_seqs = 0;
  int n_heads = 0;
  int max_entries_per_seq = 0;
  int num_splits = 0;  // 0: chosen from the GPU's SM count
  // Optional: [num_seqs * kv.n_kv_heads] counters, all zero, that let the last split of each
  // (sequence, KV head) merge the splits itself (last_split_merge.cuh) instead of a combine
  // kernel after the launch. The kernel leaves them zero. REQUIRES launches that share
  // counters to run one after another (stream order). Null: the combine kernel.
  int32_t* split_counters = nullptr;
  // Optional (qkv null: a KV write ran before, and q holds the raw queries): the step's new
  // tokens, one per sequence, which the kernel writes into the pools itself (the KV write
  // fused, bit for bit LaunchKvWrite's keys and values), reading the raw query from the same
  // rows (q unused). REQUIRES each sequence's new token to be the last token of its last
  // block-table entry, at (slot_blocks[s], slot_index[s]) of that entry's block, and the
  // pools of the new tokens' slots to be read by no other kernel before this one ends.
  struct NewTokens {
    const float* qkv = nullptr;               // [num_seqs][(n_heads + 2 * n_kv_heads) * head_dim]
    const int32_t* slot_blocks = nullptr;     // [num_seqs]
    const int32_t* slot_index = nullptr;      // [num_seqs]
    const int32_t* rope_positions = nullptr;  // [num_seqs]: the position the key is rotated to
  } new_tokens;
};

// The decode parameters over the same pool, block tables, queries and output as a prefill
// launch whose sequences have one query each, at `positions` (device, one per sequence).
inline DecodeAttentionParams DecodeParamsFrom(const PrefillAttentionParams& p, const int32_t* positions,
                                              int max_entries_per_seq) {
  DecodeAttentionParams d;
  d.q = p.q;
  d.kv = p.kv;
  d.positions = positions;
  d.out = p.out;
  d.num_seqs = p.num_seqs;
  d.n_heads = p.n_heads;
  d.max_entries_per_seq = max_entries_per_seq;
  return d;
}

// Splits the launcher will use for these shapes on the current device.
int ChooseDecodeSplits(const DecodeAttentionParams& p);
size_t DecodeWorkspaceBytes(const DecodeAttentionParams& p, int num_splits);

// Validates the shapes and launches; errors come back as cudaError_t
// (cudaErrorInvalidValue for shapes the kernel does not support).
cudaError_t LaunchLazyDecodeAttention(DecodeAttentionParams p, cudaStream_t stream);

}  // namespace lazykv::cuda
