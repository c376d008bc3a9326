// Y = X W^T on the GPU through cuBLASLt: X [rows][in] and W [out][in] (PyTorch layout)
// both bf16 or both fp32, Y fp32 [rows][out], fp32 accumulation (CPU twin:
// cpu::MatmulTransposed). fp32 inputs run in true fp32 (CUBLAS_COMPUTE_32F, never TF32).
// cuBLASLt picks the kernel by heuristic once per shape; where it offers none (odd
// leading dimensions), plain cuBLAS (cublasGemmEx) runs the product instead. Both are
// opened at Create (cublas_api.h), not linked. A bf16 product of at most
// kSkinnyGemmFasterRows rows (a small decode step's) runs the skinny kernel instead
// (skinny_gemm.h), which streams W closer to the memory's rate; with skinny_mma_kernel, one
// of 5 to kSkinnyMmaFasterRows rows runs the tensor-core skinny kernel (skinny_mma_gemm.h).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/skinny_mma_gemm.h"

namespace lazykv::cuda {

struct CublasApi;

// The most rows Gemm gives the tensor-core skinny kernel: on the H100 it streams the 8B shape's
// weights 1.00-1.055x as fast as cuBLASLt at 5-16 rows and 0.77-0.96x at 20-64
// (bench/results/skinny_mma_2026-11-28.md), so cuBLASLt keeps the larger products.
inline constexpr int kSkinnyMmaFasterRows = 16;
// Every row count Gemm gives the kernel also takes the fused rounding of the attention output
// (RunLayers decides the fusions by SkinnyMmaRows).
static_assert(kSkinnyMmaFasterRows <= kSkinnyMmaRoundingMaxRows, "a step's output GEMM would lose its fusion");

// Whether Gemm runs the tensor-core skinny kernel at 5 to kSkinnyMmaFasterRows rows by
// default: yes unless LAZYKV_SKINNY_MMA=0 (cuBLASLt there, for comparisons in one binary).
bool SkinnyMmaByDefault();

struct GemmOptions {
  // False: cuBLASLt for every shape (to measure the skinny kernels against it).
  bool skinny_kernel = true;
  // With skinny_kernel: products of 5 to kSkinnyMmaFasterRows rows by the tensor-core skinny kernel.
  bool skinny_mma_kernel = SkinnyMmaByDefault();
};

// Not thread-safe: one per stream.
class Gemm {
 public:
  static absl::StatusOr<std::unique_ptr<Gemm>> Create(cudaStream_t stream, GemmOptions options = {});
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // y = x w^T (beta = 0) or y += x w^T (beta = 1).
  absl::Status Run(const __nv_bfloat16* x, int rows, int in, const __nv_bfloat16* w, int out, float* y,
                   float beta = 0.0f) {
    return RunTyped(x, rows, in, w, out, y, beta, /*fp32_inputs=*/false);
  }
  absl::Status Run(const float* x, int rows, int in, const float* w, int out, float* y, float beta = 0.0f) {
    return RunTyped(x, rows, in, w, out, y, beta, /*fp32_inputs=*/true);
  }
  // Whether Run gives a bf16 product of `rows` rows to the tensor-core skinny kernel (where
  // the kernel takes its shape): 5 to kSkinnyMmaFasterRows rows with skinny_kernel and
  // skinny_mma_kernel.
  bool SkinnyMmaRows(int rows) const;
  // That kernel's scratch, for its fused launches beside Run (skinny_mma_gemm.h): used in
  // stream order on this Gemm's stream only.
  SkinnyMmaScratch mma_scratch() const;
  // cuBLASLt shapes planned so far (each planned once, at its first Run: a heuristic query
  // and, on the first launch of a kernel, its loading; Backend::WarmUp plans ahead). The
  // skinny kernel plans nothing.
  size_t plans() const { return plans_.size(); }
  const GemmOptions& options() const { return options_; }

 private:
  struct Plan;
  Gemm() = default;
  absl::Status RunTyped(const void* x, int rows, int in, const void* w, int out, float* y, float beta,
                        bool fp32_inputs);
  absl::StatusOr<Plan*> PlanFor(int rows, int in, int out, float beta, bool fp32_inputs);

  GemmOptions options_;
  const CublasApi* api_ = nullptr;  // cuBLAS opened on first use (cublas_api.h)
  cudaStream_t stream_ = nullptr;
  void* lt_ = nullptr;    // cublasLtHandle_t
  void* blas_ = nullptr;  // cublasHandle_t (fallback)
  // cuBLASLt's workspace, also the tensor-core skinny kernel's partial sums (both stream-ordered
  // on stream_), and that kernel's split counters (zeroed at Create).
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  int32_t* mma_counters_ = nullptr;
  std::map<std::tuple<int, int, int, bool, bool>, std::unique_ptr<Plan>> plans_;
};

}  // namespace lazykv::cuda
