// Materialize for the block baseline (Block-Attention) on the GPU.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/element_type.h"

namespace lazykv::cuda {

// The block baseline's materialize on the GPU: for each copy i, the first num_tokens[i]
// slots of dst_blocks[i] get src_blocks[i]'s keys rotated by deltas[i] and its values.
struct MaterializeParams {
  void* k_pool = nullptr;
  void* v_pool = nullptr;
  Element kv_element = Element::kBf16;
  const int32_t* src_blocks = nullptr;
  const int32_t* dst_blocks = nullptr;
  const int32_t* num_tokens = nullptr;
  const int32_t* deltas = nullptr;
  const double* inv_freq = nullptr;
  int num_copies = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int block_size = 0;
  int rope_style = 0;
};

cudaError_t LaunchMaterialize(const MaterializeParams& p, cudaStream_t stream);

}  // namespace lazykv::cuda
