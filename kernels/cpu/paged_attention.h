// Lazy-RoPE attention over a paged KV pool (CPU reference, DESIGN.md section 2).
//
// A query at logical position p with raw (unrotated) vector q scores a stored key k of
// a block with rotation delta d as <R(p - d) q, k>: the query is rotated once per run of
// blocks sharing a delta, the keys never. With every delta 0 this is ordinary attention.
// The context's logical positions are contiguous: the block table in order, each block
// contributing num_tokens positions; a query sees the keys at positions <= its own.
#pragma once

#include <cstdint>
#include <span>

#include "kernels/cpu/rope.h"
#include "kernels/kv_block_ref.h"

namespace lazykv::cpu {

// One layer of a paged KV pool: K and V are each [num_blocks][block_size][n_kv_heads * head_dim].
struct KvLayerView {
  float* k = nullptr;
  float* v = nullptr;
  int num_blocks = 0;
  int block_size = 0;
  int n_kv_heads = 0;
  int head_dim = 0;

  size_t slot_offset(int32_t block, int32_t slot) const {
    return (static_cast<size_t>(block) * block_size + slot) * static_cast<size_t>(n_kv_heads) * head_dim;
  }
};

// q and out are [n_queries][n_heads * head_dim]; positions[i] is query i's logical position.
void LazyPagedAttention(const float* q, const int32_t* positions, int n_queries, int n_heads,
                        std::span<const KvBlockRef> context, const KvLayerView& kv, const RopeTable& rope, float* out);

// The block baseline's materialize: dst slots get the src keys re-rotated by `delta`
// (k' = R(delta) k) and the values copied, for slots [first_slot, end_slot).
void CopyBlockRotated(const KvLayerView& kv, int32_t src_block, int32_t dst_block, int32_t first_slot,
                      int32_t end_slot, int32_t delta, const RopeTable& rope);

}  // namespace lazykv::cpu
