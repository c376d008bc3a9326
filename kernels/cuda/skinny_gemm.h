// Y = X W^T for a few rows of X (a decode step's batch): bf16 X [rows][in] and W [out][in],
// fp32 Y [rows][out], fp32 accumulation (CPU twin: cpu::MatmulTransposed). At one to a few
// rows the product is a stream of W from memory, which this kernel reads once at close to
// the memory's rate: each warp takes whole rows of W in 16-byte loads, several in flight,
// against every row of X (read through L1), and reduces across its lanes. cuBLASLt picks a
// tensor-core tile for such shapes. A decode step's GEMMs of Llama-3-8B on the H100
// (`cuda_backend_bench`, bench/results/skinny_gemm_2026-11-27.md): at 1 row 1.06x cuBLASLt
// (2.70 against 2.55 TB/s of weights), 1.04x at 2-3, 1.01-1.02x at 4, 0.88-1.00x at 5-8. A
// tensor-core variant for 5 to 16 rows (mma.sync fragments loaded straight from memory) ran
// at 0.72-0.84x cuBLASLt and was not kept (bench/results/decode_step_2026-11-27.md).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace lazykv::cuda {

// The most rows of X the kernel takes.
inline constexpr int kSkinnyGemmMaxRows = 8;
// The most rows for which Gemm runs it: past 4 rows cuBLASLt is as fast or faster.
inline constexpr int kSkinnyGemmFasterRows = 4;

// Whether the kernel takes this product: 1 <= rows <= kSkinnyGemmMaxRows, `in` a multiple of
// 8, and x and w 16-byte aligned.
bool SkinnyGemmApplies(const void* x, int rows, int in, const __nv_bfloat16* w);

// Whether the normed kernels (LaunchSkinnyGemmNormingX, LaunchSkinnyGateUpSwiGluNormingX) take
// this product: SkinnyGemmApplies(x, rows, in, w) and `gain` 16-byte aligned.
bool SkinnyNormApplies(const float* x, const float* gain, int rows, int in, const __nv_bfloat16* w);

// y = x w^T (beta 0) or y += x w^T (beta 1), on `stream`. REQUIRES SkinnyGemmApplies.
cudaError_t LaunchSkinnyGemm(const __nv_bfloat16* x, int rows, int in, const __nv_bfloat16* w, int out, float* y,
                             float beta, cudaStream_t stream);

// y = bf16(x) w^T (beta 0) or y += bf16(x) w^T (beta 1) for fp32 x, each value rounded to
// bf16 as it is loaded (as LaunchToBf16 rounds it): bit for bit LaunchToBf16 then
// LaunchSkinnyGemm, without the bf16 copy of x. REQUIRES SkinnyGemmApplies.
cudaError_t LaunchSkinnyGemmRoundingX(const float* x, int rows, int in, const __nv_bfloat16* w, int out, float* y,
                                      float beta, cudaStream_t stream);

// y = RMSNorm(x) w^T for fp32 x (the residual stream) and the norm's fp32 gain [in]: per row,
// s = rsqrt(mean(x^2) + eps) and y = s * (bf16(gain * x) w^T), the sum of squares taken
// in the GEMM's own loads of x. Not bit for bit LaunchResidualRmsNorm then LaunchSkinnyGemm
// (which rounds gain * x * s to bf16): the same to within bf16's rounding of x's elements.
// REQUIRES SkinnyNormApplies(x, gain, rows, in, w).
cudaError_t LaunchSkinnyGemmNormingX(const float* x, const float* gain, float eps, int rows, int in,
                                     const __nv_bfloat16* w, int out, float* y, cudaStream_t stream);

// h = SwiGLU(x w_gate_up^T) in bf16, for w_gate_up = [gate; up] (2 * hidden rows of `in`):
// bit for bit LaunchSkinnyGemm into [rows][2 * hidden] then LaunchSwiGlu, without the fp32
// product in between. REQUIRES SkinnyGemmApplies(x, rows, in, w_gate_up).
cudaError_t LaunchSkinnyGateUpSwiGlu(const __nv_bfloat16* x, int rows, int in, const __nv_bfloat16* w_gate_up,
                                     int hidden, __nv_bfloat16* h, cudaStream_t stream);

// LaunchSkinnyGateUpSwiGlu of RMSNorm(x), normed as LaunchSkinnyGemmNormingX norms it (the
// scale applied to the gate and up products before SwiGLU). REQUIRES
// SkinnyNormApplies(x, gain, rows, in, w_gate_up).
cudaError_t LaunchSkinnyGateUpSwiGluNormingX(const float* x, const float* gain, float eps, int rows, int in,
                                             const __nv_bfloat16* w_gate_up, int hidden, __nv_bfloat16* h,
                                             cudaStream_t stream);

}  // namespace lazykv::cuda
