// The CPU backend: the reference implementation for every other backend. fp32 by default;
// optionally with the CUDA backend's bf16 rounding, so that the GPU can be checked against
// the same function up to fp32 accumulation order.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "worker/backend/backend.h"
#include "worker/model/model_weights.h"

namespace lazykv {

enum class CpuNumerics {
  // fp32 weights, activations and KV; kv_dtype "fp32".
  kFp32,
  // Rounds to bf16 (round to nearest even) exactly where the CUDA backend stores bf16, and
  // nowhere else (but for the CUDA backend's small bf16 steps, whose QKV and gate/up GEMMs norm
  // in their loads and round gain * x before the norm's scale; LAZYKV_NORM_IN_GEMM=0 there
  // restores the points below):
  //  - every weight matrix (embedding, classifier, wq, wk, wv, wo, w_gate, w_up, w_down);
  //    the norm weights stay fp32;
  //  - the RMSNorm outputs that feed a GEMM (attention norm, FFN norm, final norm);
  //  - the attention output before wo, the SwiGLU output before w_down;
  //  - K (after its rotation) and V as they are written to the pool, and the keys a block
  //    copy re-rotates (kv_dtype "bf16": chunk payloads are bf16, and the model
  //    fingerprint is the CUDA backend's for the same weights).
  // fp32 as on the GPU: the residual stream, GEMM outputs (q, k, v before the pool,
  // gate/up, logits), the query and its rotation, scores, softmax and accumulation.
  // This is the GPU's generic attention kernel and its decode kernel; the tensor-core
  // prefill kernel (head dims 64 and 128) also rounds the rotated query and the
  // probabilities to bf16, which this mode does not.
  kBf16LikeCuda,
};

struct CpuBackendOptions {
  CpuNumerics numerics = CpuNumerics::kFp32;
};

// Bytes of fp32 K and V one block holds across all layers (sizes the pool from a budget;
// the pool is fp32 in both numerics).
uint64_t CpuKvBytesPerBlock(const ModelConfig& config, int block_size);

absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackend(ModelWeights weights, int block_size, int num_blocks,
                                                          CpuBackendOptions options = {});

}  // namespace lazykv
