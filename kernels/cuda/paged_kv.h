// One layer's paged KV pool as every CUDA kernel that touches it sees it: the pools, their
// element type and geometry, the block table over them and the RoPE that relates stored
// keys to logical positions. A plain struct of device pointers and sizes (no CUDA runtime
// calls), passed by value inside each kernel's parameters, usable from host and device code.
//
// Pool layout: [num_blocks][block_size][n_kv_heads][head_dim] of `element`, K and V alike;
// slot s of block b, KV head h starts at ((b * block_size + s) * n_kv_heads + h) * head_dim.
//
// Block table (the attention kernels): the tables of all sequences are concatenated; sequence
// s owns entries [table_offsets[s], table_offsets[s + 1]) in logical order. Entry e is pool
// block block_ids[e] holding block_tokens[e] valid slots from slot 0 (a partly filled block
// anywhere in the table is fine), its keys stored rotated to position (logical - block_deltas[e]),
// its first slot at logical position block_starts[e] (contiguous: an entry starts where the
// previous one ended).
//
// Which kernel reads what (fields a kernel does not read may stay null or zero):
//  - attention (lazy prefill, lazy decode, generic): everything; the pools are only read,
//    but for the new tokens' slots that the decode kernel writes when it runs the KV write
//    fused (DecodeAttentionParams::new_tokens).
//  - KV write (model_ops.h): pools (written), element, geometry, RoPE; no block table.
//  - materialize (materialize.h): pools (read and written), element, geometry, RoPE; its
//    copies come as their own lists, not as a block table.
//  - KV transfer (model_ops.h): pools (read or written) of all layers from layer 0 on,
//    element, block_ids and block_tokens (the chunk's blocks), n_kv_heads * head_dim (the row
//    width) and block_size; no RoPE, deltas, starts or offsets.
// The pools are non-const for the kernels that write them; the attention kernels only read.
#pragma once

#include <cstdint>

#include "kernels/cuda/element_type.h"

namespace lazykv::cuda {

// The pairs of dimensions RoPE rotates together: (2i, 2i + 1) or (i, i + head_dim / 2).
// The model config has its own enum (common/model_config.h); rope_style.h converts.
enum class RopeStyle : int { kInterleaved = 0, kRotateHalf = 1 };

struct PagedKv {
  void* k_pool = nullptr;
  void* v_pool = nullptr;
  Element element = Element::kBf16;
  const int32_t* block_ids = nullptr;
  const int32_t* block_tokens = nullptr;   // valid slots per entry
  const int32_t* block_deltas = nullptr;   // rotation delta per entry
  const int32_t* block_starts = nullptr;   // logical position of each entry's first slot
  const int32_t* table_offsets = nullptr;  // [num_seqs + 1]
  const double* inv_freq = nullptr;        // [head_dim / 2]
  int n_kv_heads = 0;
  int head_dim = 0;
  int block_size = 0;
  // Slots in each pool (its blocks x block_size), for tensor maps over the pools; 0: unknown
  // (the prefill kernel then copies every KV tile with cp.async).
  long long pool_slots = 0;
  RopeStyle rope_style = RopeStyle::kInterleaved;
};

}  // namespace lazykv::cuda
