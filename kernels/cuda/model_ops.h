// The small kernels of the Llama forward pass on the GPU (the attention kernels and the
// GEMMs have their own headers). Activations between GEMMs are fp32 (the residual stream,
// GEMM outputs); GEMM inputs, weight matrices and the KV pool are bf16, or fp32 in the
// backend's fp32 mode (element_type.h): the launchers that touch them come in both. Each
// launcher checks its shapes and returns the launch's cudaError_t. CPU twins:
// kernels/cpu/dense_ops.h, rope.h and the CPU backend.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/element_type.h"
#include "kernels/cuda/paged_kv.h"

namespace lazykv::cuda {

// x[r] = table[tokens[r]] for `rows` rows of `dim` (fp32 rows). embedding.cu
cudaError_t LaunchEmbeddingGather(const __nv_bfloat16* table, const int32_t* tokens, int rows, int dim, float* x,
                                  cudaStream_t stream);
cudaError_t LaunchEmbeddingGather(const float* table, const int32_t* tokens, int rows, int dim, float* x,
                                  cudaStream_t stream);

// dst[i] = src[rows[i]] for n rows of `dim` values (the output layer's rows, gathered
// into one matrix for one classifier GEMM). embedding.cu
cudaError_t LaunchGatherRows(const __nv_bfloat16* src, const int32_t* rows, int n, int dim, __nv_bfloat16* dst,
                             cudaStream_t stream);
cudaError_t LaunchGatherRows(const float* src, const int32_t* rows, int n, int dim, float* dst, cudaStream_t stream);

// With `residual`: x[r] += residual[r] first (written back). Then out[r] = x[r] /
// rms(x[r]) * weight (rounded to bf16 for a bf16 out). One pass over x for the add and
// the norm. `weight` may be read before the kernels enqueued before it on `stream` end (a
// dependent launch): it must not be written by them (it is a model's weights). rms_norm.cu
cudaError_t LaunchResidualRmsNorm(float* x, const float* residual, const float* weight, int rows, int dim, float eps,
                                  __nv_bfloat16* out, cudaStream_t stream);
cudaError_t LaunchResidualRmsNorm(float* x, const float* residual, const float* weight, int rows, int dim, float eps,
                                  float* out, cudaStream_t stream);

// out[r][i] = silu(gu[r][i]) * gu[r][hidden + i] (rounded for a bf16 out): gate and up
// side by side in one row of 2 * hidden (the fused gate/up GEMM's output). swiglu.cu
cudaError_t LaunchSwiGlu(const float* gu, int rows, int hidden, __nv_bfloat16* out, cudaStream_t stream);
cudaError_t LaunchSwiGlu(const float* gu, int rows, int hidden, float* out, cudaStream_t stream);

// out = bf16(in), n elements. swiglu.cu
cudaError_t LaunchToBf16(const float* in, size_t n, __nv_bfloat16* out, cudaStream_t stream);

// The new tokens' q/k/v from the fused QKV GEMM (rows of q_dim + 2 * kv_dim) to where
// attention reads them: q copied raw (the attention kernels rotate it) into q_out
// [rows][q_dim]; k rotated by R(rope_positions[r]) and v, both rounded to the pool's
// element, written to pool slot (slot_blocks[r], slot_index[r]) of one layer's K/V pool
// (kv: pools, element, geometry and RoPE; no block table). kv_write.cu
struct KvWriteParams {
  const float* qkv = nullptr;
  float* q_out = nullptr;
  PagedKv kv;
  const int32_t* slot_blocks = nullptr;
  const int32_t* slot_index = nullptr;
  const int32_t* rope_positions = nullptr;  // the position the key is stored at (position - delta)
  int rows = 0;
  int n_heads = 0;
  // Rows [rotated_q_from, rows) get q rotated at q_positions[r], their logical positions (what
  // the lazy prefill kernels take with PrefillAttentionParams::q_rotated); the rows before, and
  // every row where q_positions is null, get q raw (the decode kernels rotate it themselves).
  // With q_positions, head_dim <= 512.
  const int32_t* q_positions = nullptr;
  int rotated_q_from = 0;
};
cudaError_t LaunchKvWrite(const KvWriteParams& p, cudaStream_t stream);

// Moves a chunk's KV between a contiguous payload in device memory (the chunk codec's
// layout [layer][K|V][token][kv_dim], common/chunk_codec.h) and pool blocks, for layers
// [first_layer, first_layer + num_layers). kv.k_pool and kv.v_pool hold all layers,
// [n_layers][pool_blocks][block_size][kv_dim] with kv_dim = kv.n_kv_heads * kv.head_dim;
// kv.element is the payload's and the pool's. Block i of the chunk is pool block
// kv.block_ids[i] and holds kv.block_tokens[i] tokens from slot 0; its first token is
// token_offsets[i] of the chunk. kv_transfer.cu
struct KvTransferParams {
  void* payload = nullptr;  // the whole chunk's payload
  PagedKv kv;
  const int32_t* token_offsets = nullptr;
  int num_blocks_in_chunk = 0;
  int chunk_tokens = 0;
  int pool_blocks = 0;
  int first_layer = 0;
  int num_layers = 0;
  bool to_pool = true;  // false: gather the pool blocks into the payload
};
cudaError_t LaunchKvTransfer(const KvTransferParams& p, cudaStream_t stream);

// Fills n bf16 (or fp32) values exactly as MakeSyntheticWeights draws them on the CPU:
// value i is scale * (2 u_i - 1) (norms: 1 + 0.1 (2 u_i - 1)) with u_i the (i+1)-th
// SplitMix64Unit output from `state`. synthetic_fill.cu
cudaError_t LaunchSyntheticFill(uint64_t state, size_t n, float scale, bool is_norm, __nv_bfloat16* out_bf16,
                                float* out_fp32, cudaStream_t stream);

}  // namespace lazykv::cuda
