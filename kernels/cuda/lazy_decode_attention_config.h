// Internal to the decode kernel and its benchmark: the launch configuration (warps per CTA,
// shared-memory pipeline stages per warp) behind LaunchLazyDecodeAttention, exposed so that
// cuda_decode_bench can time the alternatives in one run. Callers use lazy_decode_attention.h.
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda/lazy_decode_attention.h"

namespace lazykv::cuda::detail {

struct DecodeKernelConfig {
  int warps = 4;   // warps per CTA, each with its own contiguous range of block-table entries
  int stages = 3;  // 16-token K+V tiles per warp in shared memory (cp.async pipeline depth)
};

// The configuration LaunchLazyDecodeAttention uses.
DecodeKernelConfig DefaultDecodeConfig();

// The configurations the launcher can run at head dim 128 (the default one among them);
// head dim 64 always runs the default.
int NumDecodeConfigs();
DecodeKernelConfig DecodeConfigAt(int index);

// ChooseDecodeSplits and LaunchLazyDecodeAttention for a given configuration.
int ChooseDecodeSplitsFor(const DecodeAttentionParams& p, DecodeKernelConfig config);
cudaError_t LaunchLazyDecodeAttentionWith(DecodeAttentionParams p, DecodeKernelConfig config, cudaStream_t stream);

}  // namespace lazykv::cuda::detail
