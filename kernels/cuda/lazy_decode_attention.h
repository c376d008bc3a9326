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

namespace lazykv::cuda {

// Device pointers. Block tables of all sequences are concatenated; sequence s owns
// entries [table_offsets[s], table_offsets[s + 1]).
struct DecodeAttentionParams {
  const float* q = nullptr;     // [num_seqs][n_heads][head_dim], raw (unrotated)
  const void* k_pool = nullptr;  // bf16 [num_blocks][block_size][n_kv_heads][head_dim], one layer
  const void* v_pool = nullptr;
  const int32_t* block_ids = nullptr;
  const int32_t* block_tokens = nullptr;  // valid slots per entry
  const int32_t* block_deltas = nullptr;
  const int32_t* block_starts = nullptr;  // logical position of each entry's first slot
  const int32_t* table_offsets = nullptr;  // [num_seqs + 1]
  const int32_t* positions = nullptr;      // [num_seqs]: the query's logical position
  const double* inv_freq = nullptr;        // [head_dim / 2]
  float* out = nullptr;                    // [num_seqs][n_heads][head_dim]
  float* workspace = nullptr;              // DecodeWorkspaceBytes()
  int num_seqs = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;   // 64 or 128
  int block_size = 0;
  int rope_style = 0;  // 0: interleaved pairs, 1: rotate-half
  int max_entries_per_seq = 0;
  int num_splits = 0;  // 0: chosen from the GPU's SM count
};

// The decode parameters over the same pool, block tables, queries and output as a prefill
// launch whose sequences have one query each, at `positions` (device, one per sequence).
inline DecodeAttentionParams DecodeParamsFrom(const PrefillAttentionParams& p, const int32_t* positions,
                                              int max_entries_per_seq) {
  DecodeAttentionParams d;
  d.q = p.q;
  d.k_pool = p.k_pool;
  d.v_pool = p.v_pool;
  d.block_ids = p.block_ids;
  d.block_tokens = p.block_tokens;
  d.block_deltas = p.block_deltas;
  d.block_starts = p.block_starts;
  d.table_offsets = p.table_offsets;
  d.positions = positions;
  d.inv_freq = p.inv_freq;
  d.out = p.out;
  d.num_seqs = p.num_seqs;
  d.n_heads = p.n_heads;
  d.n_kv_heads = p.n_kv_heads;
  d.head_dim = p.head_dim;
  d.block_size = p.block_size;
  d.rope_style = p.rope_style;
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
