#include "kernels/cuda/gemm.h"

#include "absl/strings/str_format.h"
#include "common/env_switch.h"
#include "kernels/cuda/cublas_api.h"
#include "kernels/cuda/skinny_gemm.h"
#include "kernels/cuda/skinny_mma_gemm.h"

namespace lazykv::cuda {
namespace {

constexpr size_t kWorkspaceBytes = 32ull << 20;
// Split counters of the tensor-core skinny kernel: one per tile of 64 outputs (a split product
// has fewer tiles than 4 CTAs an SM; more tiles run unsplit).
constexpr int kMmaCounterSlots = 4096;

absl::Status LtError(cublasStatus_t s, const char* what) {
  return absl::InternalError(absl::StrFormat("%s: cuBLAS status %d", what, static_cast<int>(s)));
}

}  // namespace

bool SkinnyMmaByDefault() {
  static const bool on = EnvSwitchOn("LAZYKV_SKINNY_MMA");
  return on;
}

// Column-major view: Y^T [out x rows] = W [in x out]^T * X^T [in x rows].
struct Gemm::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool use_lt = false;
  const CublasApi* api = nullptr;
  ~Plan() {
    if (desc) api->LtMatmulDescDestroy(desc);
    if (a) api->LtMatrixLayoutDestroy(a);
    if (b) api->LtMatrixLayoutDestroy(b);
    if (c) api->LtMatrixLayoutDestroy(c);
  }
};

absl::StatusOr<std::unique_ptr<Gemm>> Gemm::Create(cudaStream_t stream, GemmOptions options) {
  auto api = Cublas();
  if (!api.ok()) return api.status();
  std::unique_ptr<Gemm> g(new Gemm());
  g->api_ = *api;
  g->options_ = options;
  g->stream_ = stream;
  cublasLtHandle_t lt;
  if (cublasStatus_t s = g->api_->LtCreate(&lt); s != CUBLAS_STATUS_SUCCESS) return LtError(s, "cublasLtCreate");
  g->lt_ = lt;
  cublasHandle_t blas;
  if (cublasStatus_t s = g->api_->Create(&blas); s != CUBLAS_STATUS_SUCCESS) return LtError(s, "cublasCreate");
  g->blas_ = blas;
  g->api_->SetStream(blas, stream);
  if (cudaError_t e = cudaMalloc(&g->workspace_, kWorkspaceBytes); e != cudaSuccess) {
    return absl::ResourceExhaustedError(absl::StrFormat("GEMM workspace: %s", cudaGetErrorString(e)));
  }
  g->workspace_bytes_ = kWorkspaceBytes;
  if (cudaError_t e = cudaMalloc(&g->mma_counters_, kMmaCounterSlots * sizeof(int32_t)); e != cudaSuccess) {
    return absl::ResourceExhaustedError(absl::StrFormat("GEMM split counters: %s", cudaGetErrorString(e)));
  }
  if (cudaError_t e = cudaMemsetAsync(g->mma_counters_, 0, kMmaCounterSlots * sizeof(int32_t), stream);
      e != cudaSuccess) {
    return absl::InternalError(absl::StrFormat("GEMM split counters: %s", cudaGetErrorString(e)));
  }
  g->api_->SetWorkspace(blas, g->workspace_, g->workspace_bytes_);
  return g;
}

Gemm::~Gemm() {
  plans_.clear();
  if (lt_) api_->LtDestroy(static_cast<cublasLtHandle_t>(lt_));
  if (blas_) api_->Destroy(static_cast<cublasHandle_t>(blas_));
  if (workspace_) cudaFree(workspace_);
  if (mma_counters_) cudaFree(mma_counters_);
}

bool Gemm::SkinnyMmaRows(int rows) const {
  return options_.skinny_kernel && options_.skinny_mma_kernel && rows > kSkinnyGemmFasterRows &&
         rows <= kSkinnyMmaFasterRows;
}

SkinnyMmaScratch Gemm::mma_scratch() const {
  return {.workspace = static_cast<float*>(workspace_),
          .workspace_bytes = workspace_bytes_,
          .counters = mma_counters_,
          .counter_slots = kMmaCounterSlots};
}

absl::StatusOr<Gemm::Plan*> Gemm::PlanFor(int rows, int in, int out, float beta, bool fp32_inputs) {
  const auto key = std::make_tuple(rows, in, out, beta != 0.0f, fp32_inputs);
  if (auto it = plans_.find(key); it != plans_.end()) return it->second.get();
  auto plan = std::make_unique<Plan>();
  plan->api = api_;
  cublasStatus_t s = api_->LtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  if (s != CUBLAS_STATUS_SUCCESS) return LtError(s, "cublasLtMatmulDescCreate");
  const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
  api_->LtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a));
  api_->LtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b));
  const cudaDataType input_type = fp32_inputs ? CUDA_R_32F : CUDA_R_16BF;
  api_->LtMatrixLayoutCreate(&plan->a, input_type, in, out, in);
  api_->LtMatrixLayoutCreate(&plan->b, input_type, in, rows, in);
  api_->LtMatrixLayoutCreate(&plan->c, CUDA_R_32F, out, rows, out);
  cublasLtMatmulPreference_t pref;
  api_->LtMatmulPreferenceCreate(&pref);
  api_->LtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes_,
                                       sizeof(workspace_bytes_));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  s = api_->LtMatmulAlgoGetHeuristic(static_cast<cublasLtHandle_t>(lt_), plan->desc, plan->a, plan->b, plan->c, plan->c,
                                     pref, 1, &result, &found);
  api_->LtMatmulPreferenceDestroy(pref);
  plan->use_lt = s == CUBLAS_STATUS_SUCCESS && found > 0;
  if (plan->use_lt) plan->algo = result.algo;
  Plan* raw = plan.get();
  plans_.emplace(key, std::move(plan));
  return raw;
}

absl::Status Gemm::RunTyped(const void* x, int rows, int in, const void* w, int out, float* y, float beta,
                            bool fp32_inputs) {
  if (rows < 0 || in <= 0 || out <= 0) return absl::InvalidArgumentError("GEMM shape");
  if (rows == 0) return absl::OkStatus();
  if (!fp32_inputs && options_.skinny_kernel && (beta == 0.0f || beta == 1.0f)) {
    const auto* xb = static_cast<const __nv_bfloat16*>(x);
    const auto* wb = static_cast<const __nv_bfloat16*>(w);
    if (rows <= kSkinnyGemmFasterRows && SkinnyGemmApplies(xb, rows, in, wb)) {
      if (cudaError_t e = LaunchSkinnyGemm(xb, rows, in, wb, out, y, beta, stream_); e != cudaSuccess) {
        return absl::InternalError(absl::StrFormat("skinny GEMM: %s", cudaGetErrorString(e)));
      }
      return absl::OkStatus();
    }
    if (SkinnyMmaRows(rows) && SkinnyMmaGemmApplies(xb, rows, in, wb)) {
      if (cudaError_t e = LaunchSkinnyMmaGemm(xb, rows, in, wb, out, y, beta, mma_scratch(), stream_);
          e != cudaSuccess) {
        return absl::InternalError(absl::StrFormat("tensor-core skinny GEMM: %s", cudaGetErrorString(e)));
      }
      return absl::OkStatus();
    }
  }
  auto plan = PlanFor(rows, in, out, beta, fp32_inputs);
  if (!plan.ok()) return plan.status();
  const float alpha = 1.0f;
  if ((*plan)->use_lt) {
    const cublasStatus_t s =
        api_->LtMatmul(static_cast<cublasLtHandle_t>(lt_), (*plan)->desc, &alpha, w, (*plan)->a, x, (*plan)->b, &beta,
                       y, (*plan)->c, y, (*plan)->c, &(*plan)->algo, workspace_, workspace_bytes_, stream_);
    if (s != CUBLAS_STATUS_SUCCESS) return LtError(s, "cublasLtMatmul");
    return absl::OkStatus();
  }
  const cudaDataType input_type = fp32_inputs ? CUDA_R_32F : CUDA_R_16BF;
  const cublasStatus_t s =
      api_->GemmEx(static_cast<cublasHandle_t>(blas_), CUBLAS_OP_T, CUBLAS_OP_N, out, rows, in, &alpha, w, input_type,
                   in, x, input_type, in, &beta, y, CUDA_R_32F, out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (s != CUBLAS_STATUS_SUCCESS) return LtError(s, "cublasGemmEx");
  return absl::OkStatus();
}

}  // namespace lazykv::cuda
