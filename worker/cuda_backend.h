// The CUDA backend: bf16 weights and a bf16 paged KV pool in GPU memory, the forward pass
// as cuBLASLt GEMMs plus the kernels of kernels/cuda/, the output layer as one classifier GEMM
// per pass. ForwardAndSample samples on the GPU and copies back only the logits someone
// reads; Forward copies every wanted row back in fp32. kv_dtype "bf16".
// Built only with LAZYKV_WITH_CUDA; the CPU backend (cpu_backend.h) is its reference.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "worker/backend.h"
#include "worker/model_weights.h"

namespace lazykv {

// True when the CUDA runtime sees a GPU (always false in a build without CUDA).
bool CudaDeviceAvailable();

// Bytes of bf16 K and V one block holds across all layers.
uint64_t CudaKvBytesPerBlock(const ModelConfig& config, int block_size);

// Uploads host fp32 weights, rounded to bf16.
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const ModelWeights& weights, int block_size,
                                                           int num_blocks);
// Synthetic weights drawn on the GPU (the same values as MakeSyntheticWeights, in bf16).
absl::StatusOr<std::unique_ptr<Backend>> CreateSyntheticCudaBackend(const ModelConfig& config, uint64_t seed,
                                                                    int block_size, int num_blocks);

}  // namespace lazykv
