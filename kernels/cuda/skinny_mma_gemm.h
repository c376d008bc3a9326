// Y = X W^T on tensor cores for 1 to 64 rows of X (Gemm gives it 5 to kSkinnyMmaFasterRows, 16,
// where it measured faster than cuBLASLt: a short question's prefill, a small decode batch):
// bf16 X [rows][in] and W [out][in], fp32 Y [rows][out], fp32 accumulation (CPU twin:
// cpu::MatmulTransposed). At such row counts the product is still a stream of W from memory,
// but too many multiply-adds for the CUDA-core skinny kernel (skinny_gemm.h). Each CTA takes
// 64 rows of W and a part of K, staging W and X through shared memory with cp.async (three or
// four stages of 64 columns, swizzled for ldmatrix) and multiplying with mma.sync m16n8k16;
// where W has few rows, K is split over several CTAs whose partial sums the last of them adds
// up in a fixed order (deterministic for a shape). Launched as a dependent launch: its first
// stages of W are in flight before the kernel before it ends.
//
// A first tensor-core variant that loaded fragments straight from global memory ran at
// 0.72-0.84x cuBLASLt (bench/results/decode_step_2026-11-27.md, fourth session); this one
// stages W as cuBLASLt's tiles do.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace lazykv::cuda {

// The row counts the kernel takes (its fp32-X variant: up to kSkinnyMmaRoundingMaxRows).
inline constexpr int kSkinnyMmaMinRows = 1;
inline constexpr int kSkinnyMmaMaxRows = 64;
inline constexpr int kSkinnyMmaRoundingMaxRows = 16;
// Rows of W a CTA takes (its partial sums and counters are per such tile).
inline constexpr int kSkinnyMmaTileOut = 64;

// Device memory a split-K launch needs: `workspace` for the partial sums (splits * rows * out
// floats) and `counters`, one int32 per tile of 64 outputs, all zero between launches (each
// launch sets back to zero what it counts). Used in stream order: one launch at a time on
// the stream that owns them.
struct SkinnyMmaScratch {
  float* workspace = nullptr;
  size_t workspace_bytes = 0;
  int32_t* counters = nullptr;
  int counter_slots = 0;
};

// Whether the kernel takes this product: kSkinnyMmaMinRows <= rows <= kSkinnyMmaMaxRows, `in`
// a multiple of 8, x and w 16-byte aligned.
bool SkinnyMmaGemmApplies(const void* x, int rows, int in, const __nv_bfloat16* w);

// Parts of K a launch chooses at most: kSkinnyMmaSplitCap for bf16 X, and for fp32 X (the
// output projection, whose kernel before, the attention, leaves the memory mostly idle) twice
// as many, so that twice the CTAs are resident and load their first stages of W while the
// attention ends (dependent launch). 8 for every product made the cached TTFT 2-3% faster on
// the H200 but the products back to back 2% slower (bench/results/skinny_mma_parts_2026-11-29.md).
inline constexpr int kSkinnyMmaSplitCap = 4;
inline constexpr int kSkinnyMmaSplitCapAfterAttention = 8;

// How many parts K is split into for this shape (1: no split, no scratch used): enough CTAs
// to keep the memory busy where W has few rows, at most `cap`, at least 4 stages of K each,
// and only where `scratch` holds the partial sums and counters. LAZYKV_SKINNY_MMA_SPLITS=N asks
// N for every shape (past the cap, still at least 4 stages a part and within the scratch),
// and LAZYKV_SKINNY_MMA_MAX_SPLITS=N sets every cap to N (only shapes with few tiles of W take
// more), for measurements.
int SkinnyMmaSplits(int rows, int in, int out, const SkinnyMmaScratch& scratch, int cap = kSkinnyMmaSplitCap);

// y = x w^T (beta 0; y is not read) or y += x w^T (beta 1), on `stream`. `splits` 0 takes
// SkinnyMmaSplits (with kSkinnyMmaSplitCap); otherwise that many parts (for tests), which
// `scratch` must hold.
// cudaErrorInvalidValue where !SkinnyMmaGemmApplies, out < 1, beta not 0 or 1, or the split
// does not fit the scratch.
cudaError_t LaunchSkinnyMmaGemm(const __nv_bfloat16* x, int rows, int in, const __nv_bfloat16* w, int out, float* y,
                                float beta, const SkinnyMmaScratch& scratch, cudaStream_t stream, int splits = 0);

// The same for fp32 x of at most kSkinnyMmaRoundingMaxRows rows, each value rounded to bf16 as
// the kernel builds its fragments (as LaunchToBf16 rounds it): bit for bit LaunchToBf16 then
// LaunchSkinnyMmaGemm at the same splits, without the bf16 copy of x and its kernel. `splits`
// 0 takes SkinnyMmaSplits with kSkinnyMmaSplitCapAfterAttention.
cudaError_t LaunchSkinnyMmaGemmRoundingX(const float* x, int rows, int in, const __nv_bfloat16* w, int out, float* y,
                                         float beta, const SkinnyMmaScratch& scratch, cudaStream_t stream,
                                         int splits = 0);

// h = SwiGLU(x w_gate_up^T) in bf16, for w_gate_up = [gate; up] (2 * hidden rows of `in`): bit
// for bit LaunchSkinnyMmaGemm into [rows][2 * hidden] (same splits) then LaunchSwiGlu, without
// the fp32 product in between and the SwiGLU kernel. Its split is SkinnyMmaSplits(rows, in,
// 2 * hidden, scratch) (the partial sums are [splits][rows][2 * hidden]).
cudaError_t LaunchSkinnyMmaGateUpSwiGlu(const __nv_bfloat16* x, int rows, int in, const __nv_bfloat16* w_gate_up,
                                        int hidden, __nv_bfloat16* h, const SkinnyMmaScratch& scratch,
                                        cudaStream_t stream, int splits = 0);

}  // namespace lazykv::cuda
