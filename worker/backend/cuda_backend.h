// The CUDA backend: weights and a paged KV pool in GPU memory, the forward pass as cuBLASLt
// GEMMs plus the kernels of kernels/cuda/, the output layer as one classifier GEMM per
// pass. ForwardAndSample samples on the GPU and copies back only the logits someone reads;
// Forward copies every wanted row back in fp32.
// Built only with LAZYKV_WITH_CUDA; the CPU backend (cpu_backend.h) is its reference.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "worker/backend/backend.h"
#include "worker/model/model_weights.h"

namespace lazykv {

// True when the CUDA runtime sees a GPU (always false in a build without CUDA).
bool CudaDeviceAvailable();

enum class CudaPrecision {
  // bf16 weight matrices, GEMM inputs and KV pool, fp32 accumulation and residual stream;
  // kv_dtype "bf16". Attention on the tensor-core kernels (head dims 64 and 128). The
  // serving precision, and the one the benchmarks measure.
  kBf16,
  // fp32 throughout (GEMMs in true fp32, not TF32); kv_dtype "fp32", the same model
  // fingerprint and chunk payloads as the fp32 CPU backend. Attention on the generic
  // kernel. For small models and for checking the GPU against the CPU: greedy decoding
  // then follows the CPU's to fp32 noise, where bf16 rounding parts the two at near-ties.
  kFp32,
};

// Chunk-shared decode attention (kernels/cuda/shared_decode_attention.h): in a decode step,
// blocks that several sequences reference (a document's chunk, each at its own position) are
// read once for all of them.
enum class SharedDecode {
  kAuto,    // when the step's plan saves at least a fifth of the KV the attention reads
  kAlways,  // whenever some block is shared (tests, benchmarks)
  kOff,     // the per-sequence decode kernel only
};

// Where the KV write hands the lazy prefill kernels their query already rotated at its positions
// (PrefillAttentionParams::q_rotated), so that they rotate it only by each delta.
enum class RotatedQuery {
  kWherePersistent,  // from the first prefill launch of a step that takes the persistent kernel,
                     // which gains from it (the default)
  kAlways,           // every prefill step (tests: every schedule takes it)
  kNever,
};

struct CudaBackendOptions {
  CudaPrecision precision = CudaPrecision::kBf16;
  SharedDecode shared_decode = SharedDecode::kAuto;
  // In a step that mixes decoding sequences and prefill pieces, the decoding ones run the
  // decode kernels (and the chunk-shared one); false: every row runs the prefill kernel
  // (the former path, kept for benchmarks).
  bool decode_in_mixed_steps = true;
  // Device memory for chunks in transit (captured for publication and not yet copied out,
  // or fetched and staged but not yet imported); past it a capture or a staging fails
  // RESOURCE_EXHAUSTED (the publication is dropped, the chunk computed).
  uint64_t transfer_staging_bytes = 1ull << 30;
  // GEMMs of at most kSkinnyGemmMaxRows rows (decode steps) by the skinny kernel
  // (kernels/cuda/skinny_gemm.h); false: cuBLASLt for all (kept for benchmarks).
  bool skinny_gemm = true;
  // The prefill kernel packs the heads of a KV group into one tile where a sequence has few
  // new tokens (a question over cached documents: PrefillAttentionParams::pack_heads); false:
  // a tile per head always (kept for benchmarks).
  bool pack_prefill_heads = true;
  // LAZYKV_ROTATE_Q_IN_KV_WRITE=0 in the environment makes it kNever, for comparisons.
  RotatedQuery rotated_query = RotatedQuery::kWherePersistent;
  // The fewest work tiles for which a prefill launch takes the persistent kernel
  // (PrefillAttentionParams::persistent_min_work_tiles); 0: the launcher's (two an SM). Tests
  // set 1 so that a small model's launches take it.
  int prefill_persistent_min_work_tiles = 0;
};

// Decode steps that ran the chunk-shared attention, and the KV tokens it saved reading (per
// layer), since the backend was made; zeros for a backend that is not CUDA's.
struct SharedDecodeStats {
  uint64_t steps = 0;
  uint64_t tokens_saved = 0;
};
SharedDecodeStats CudaSharedDecodeStats(const Backend& backend);

// The prefill kernel's launches since the backend was made; zeros for a backend that is not
// CUDA's.
struct PrefillLaunchStats {
  uint64_t two_launch_steps = 0;     // steps that ran few-query sequences (which pack a KV group's
                                     // heads into a tile) as a launch apart from longer ones
  uint64_t mixed_kernel_steps = 0;   // of those, steps whose two launches took different kernels
  uint64_t persistent_launches = 0;  // launches that took the persistent kernel
};
PrefillLaunchStats CudaPrefillLaunchStats(const Backend& backend);

// GEMM shapes the backend has planned (Backend::WarmUp plans ahead; a shape first met in a
// step is planned there), and how many of them came after its warm-up; zeros for a backend
// that is not CUDA's.
struct GemmPlanStats {
  bool warmed_up = false;
  uint64_t plans = 0;
  uint64_t plans_after_warm_up = 0;
};
GemmPlanStats CudaGemmPlanStats(const Backend& backend);

// Bytes of K and V one block holds across all layers.
uint64_t CudaKvBytesPerBlock(const ModelConfig& config, int block_size, CudaPrecision precision = CudaPrecision::kBf16);

// Uploads host fp32 weights (matrices rounded to bf16 at kBf16).
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const ModelWeights& weights, int block_size, int num_blocks,
                                                           CudaBackendOptions options = {});
// Synthetic weights drawn on the GPU (the same values as MakeSyntheticWeights).
absl::StatusOr<std::unique_ptr<Backend>> CreateSyntheticCudaBackend(const ModelConfig& config, uint64_t seed,
                                                                    int block_size, int num_blocks,
                                                                    CudaBackendOptions options = {});

}  // namespace lazykv
