// Materialize for the block baseline (Block-Attention) on the GPU.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/paged_kv.h"

namespace lazykv::cuda {

// The block baseline's materialize on the GPU: for each copy i and each of num_layers
// layers, slots [first_slots[i], num_tokens[i]) of dst_blocks[i] (from slot 0 when
// first_slots is null) get src_blocks[i]'s keys rotated by deltas[i] and its values. kv: the first layer's pools (read and written), element,
// geometry and RoPE; its block table is not read (the copies are their own lists). Layer l's
// pools start l * pool_blocks blocks after the first's (the backend's layout). In place
// (src == dst) is allowed.
struct MaterializeParams {
  PagedKv kv;
  const int32_t* src_blocks = nullptr;
  const int32_t* dst_blocks = nullptr;
  const int32_t* num_tokens = nullptr;
  const int32_t* deltas = nullptr;
  const int32_t* first_slots = nullptr;  // null: every copy from slot 0
  int num_copies = 0;
  int num_layers = 1;
  int pool_blocks = 0;  // blocks per layer's pool (needed when num_layers > 1)
};

cudaError_t LaunchMaterialize(const MaterializeParams& p, cudaStream_t stream);

}  // namespace lazykv::cuda
