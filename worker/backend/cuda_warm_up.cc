// The CUDA backend's warm-up (Backend::WarmUp): what a pass chooses by its shape, chosen
// before serving. cuBLASLt picks a GEMM algorithm per row count at its first use (a
// heuristic query, then the kernel's loading at its first launch), and the activation
// buffers grow by reallocation (a cudaFree, which waits for the device). Under a served
// load almost every step has a row count not seen before, so without this the first
// minutes of serving pay both in the middle of steps: a fresh worker ran its lazy steps
// ~10% slower than an in-process benchmark whose lazy run came after a block run had met
// the same shapes (bench/results/served_2026-11-27.md).
#include <spdlog/spdlog.h>

#include <chrono>

#include "kernels/cuda/skinny_gemm.h"
#include "kernels/cuda/skinny_mma_gemm.h"
#include "worker/backend/cuda_backend_internal.h"

namespace lazykv::cuda_backend {

template <typename T>
absl::Status CudaBackend::WarmUpGemms(int max_rows, int max_logit_rows) {
  const int dim = c_.dim, q_dim = c_.q_dim(), kv_dim = c_.kv_dim(), hidden = c_.hidden_dim;
  auto matrix = [](const void* w) { return static_cast<const T*>(w); };
  const DeviceLayer& lw = w_->layer(0);  // every layer has the same shapes
  // The GEMMs read zeros (their outputs are scratch): no NaN from stale memory.
  RETURN_IF_ERROR(Cuda(cudaMemsetAsync(xb_.as<T>(), 0, static_cast<size_t>(max_rows) * dim * sizeof(T), stream_),
                       "warm-up inputs"));
  RETURN_IF_ERROR(Cuda(cudaMemsetAsync(h_.as<T>(), 0, static_cast<size_t>(max_rows) * hidden * sizeof(T), stream_),
                       "warm-up inputs"));
  const T* attention_out;
  if constexpr (std::is_same_v<T, float>) {
    attention_out = attn_.as<float>();
  } else {
    attention_out = attn_in_.as<T>();
  }
  RETURN_IF_ERROR(Cuda(
      cudaMemsetAsync(const_cast<T*>(attention_out), 0, static_cast<size_t>(max_rows) * q_dim * sizeof(T), stream_),
      "warm-up inputs"));
  // RunLayers' four GEMMs, in its order, at every row count.
  for (int rows = 1; rows <= max_rows; ++rows) {
    RETURN_IF_ERROR(gemm_->Run(xb_.as<T>(), rows, dim, matrix(lw.wqkv), q_dim + 2 * kv_dim, qkv_.as<float>()));
    RETURN_IF_ERROR(gemm_->Run(attention_out, rows, q_dim, matrix(lw.wo), dim, y_.as<float>()));
    RETURN_IF_ERROR(gemm_->Run(xb_.as<T>(), rows, dim, matrix(lw.w_gate_up), 2 * hidden, gu_.as<float>()));
    RETURN_IF_ERROR(gemm_->Run(h_.as<T>(), rows, hidden, matrix(lw.w_down), dim, y_.as<float>()));
  }
  // The skinny GEMM's fused kernels of small steps (RunLayers), launched once per row count so
  // that their first launch (a module's loading) is not in a served step.
  if constexpr (std::is_same_v<T, bf16>) {
    RETURN_IF_ERROR(
        Cuda(cudaMemsetAsync(attn_.as<float>(), 0, static_cast<size_t>(max_rows) * q_dim * sizeof(float), stream_),
             "warm-up inputs"));
    // The residual rows the normed GEMMs read: bytes 0x3c make every float 0.0115, so that a
    // norm's mean square is not 0 (with eps 0 its scale would be infinite, and 0 times that NaN).
    RETURN_IF_ERROR(
        Cuda(cudaMemsetAsync(x_.as<float>(), 0x3c, static_cast<size_t>(max_rows) * dim * sizeof(float), stream_),
             "warm-up inputs"));
    for (int rows = 1; gemm_->options().skinny_kernel && rows <= std::min(max_rows, cuda::kSkinnyGemmFasterRows);
         ++rows) {
      if (cuda::SkinnyGemmApplies(attn_.as<float>(), rows, q_dim, matrix(lw.wo))) {
        RETURN_IF_ERROR(Cuda(cuda::LaunchSkinnyGemmRoundingX(attn_.as<float>(), rows, q_dim, matrix(lw.wo), dim,
                                                             y_.as<float>(), 0.0f, stream_),
                             "warm-up"));
      }
      if (cuda::SkinnyGemmApplies(xb_.as<T>(), rows, dim, matrix(lw.w_gate_up))) {
        RETURN_IF_ERROR(Cuda(
            cuda::LaunchSkinnyGateUpSwiGlu(xb_.as<T>(), rows, dim, matrix(lw.w_gate_up), hidden, h_.as<T>(), stream_),
            "warm-up"));
      }
      if (cuda::SkinnyNormApplies(x_.as<float>(), lw.attn_norm, rows, dim, matrix(lw.wqkv)) &&
          cuda::SkinnyNormApplies(x_.as<float>(), lw.ffn_norm, rows, dim, matrix(lw.w_gate_up))) {
        RETURN_IF_ERROR(
            Cuda(cuda::LaunchSkinnyGemmNormingX(x_.as<float>(), lw.attn_norm, c_.norm_eps, rows, dim, matrix(lw.wqkv),
                                                q_dim + 2 * kv_dim, qkv_.as<float>(), stream_),
                 "warm-up"));
        RETURN_IF_ERROR(Cuda(cuda::LaunchSkinnyGateUpSwiGluNormingX(x_.as<float>(), lw.ffn_norm, c_.norm_eps, rows, dim,
                                                                    matrix(lw.w_gate_up), hidden, h_.as<T>(), stream_),
                             "warm-up"));
      }
    }
  }
  // The tensor-core skinny kernel's fused variants of steps of 5 to kSkinnyMmaFasterRows rows
  // (RunLayers), once per row count where Gemm gives it those rows.
  if constexpr (std::is_same_v<T, bf16>) {
    for (int rows = cuda::kSkinnyGemmFasterRows + 1; rows <= max_rows && gemm_->SkinnyMmaRows(rows); ++rows) {
      if (cuda::SkinnyMmaGemmApplies(attn_.as<float>(), rows, q_dim, matrix(lw.wo))) {
        RETURN_IF_ERROR(Cuda(cuda::LaunchSkinnyMmaGemmRoundingX(attn_.as<float>(), rows, q_dim, matrix(lw.wo), dim,
                                                                y_.as<float>(), 0.0f, gemm_->mma_scratch(), stream_),
                             "warm-up"));
      }
      if (cuda::SkinnyMmaGemmApplies(xb_.as<T>(), rows, dim, matrix(lw.w_gate_up))) {
        RETURN_IF_ERROR(Cuda(cuda::LaunchSkinnyMmaGateUpSwiGlu(xb_.as<T>(), rows, dim, matrix(lw.w_gate_up), hidden,
                                                               h_.as<T>(), gemm_->mma_scratch(), stream_),
                             "warm-up"));
      }
    }
  }
  // The classifier over the rows that want logits.
  for (int rows = 1; rows <= max_logit_rows; ++rows) {
    RETURN_IF_ERROR(
        gemm_->Run(xb_.as<T>(), rows, dim, matrix(w_->output_matrix()), c_.vocab_size, logits_.as<float>()));
  }
  return Cuda(cudaStreamSynchronize(stream_), "warm-up");
}

absl::Status CudaBackend::WarmUp(int max_rows, int max_logit_rows) {
  RETURN_IF_ERROR(ValidateWarmUpShape(max_rows, max_logit_rows));
  const auto start = std::chrono::steady_clock::now();
  const size_t plans_before = gemm_->plans();
  RETURN_IF_ERROR(ReserveActivations(max_rows));
  RETURN_IF_ERROR(ReserveSplitCounters(max_rows * c_.n_kv_heads));  // a decode step of max_rows sequences
  // The classifier reads at most max_rows rows (the final norm's output), gathered into
  // out_rows_ when they are not all of them.
  max_logit_rows = std::min(max_logit_rows, max_rows);
  const size_t elem = cuda::ElementBytes(element_);
  RETURN_IF_ERROR(out_rows_.Reserve(static_cast<size_t>(std::max(1, max_logit_rows)) * c_.dim * elem));
  RETURN_IF_ERROR(logits_.Reserve(static_cast<size_t>(std::max(1, max_logit_rows)) * c_.vocab_size * sizeof(float)));
  RETURN_IF_ERROR(element_ == cuda::Element::kFp32 ? WarmUpGemms<float>(max_rows, max_logit_rows)
                                                   : WarmUpGemms<bf16>(max_rows, max_logit_rows));
  gemm_plans_after_warm_up_ = gemm_->plans();
  spdlog::info("backend warm-up: passes of up to {} rows and {} rows of logits, {} GEMM shapes planned in {:.2f} s",
               max_rows, max_logit_rows, *gemm_plans_after_warm_up_ - plans_before,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return absl::OkStatus();
}

std::string CudaBackend::ProfileSummary() const {
  // GEMM shapes planned after the warm-up each cost a step a heuristic query and perhaps a
  // kernel's loading: a served run should show none.
  const GemmPlanStats gemm = gemm_plan_stats();
  const std::string timing = step_timing_.Summary();
  return absl::StrFormat(
      "chunk-shared decode attention in %d steps (%d KV tokens per layer not read again); prefill in two launches "
      "in %d steps; GEMM shapes planned: %d, %s%s",
      shared_stats_.steps, shared_stats_.tokens_saved, prefill_stats_.two_launch_steps, gemm.plans,
      gemm.warmed_up ? absl::StrFormat("%d of them after the warm-up", gemm.plans_after_warm_up) : "no warm-up ran",
      timing.empty() ? "" : "; " + timing);
}

}  // namespace lazykv::cuda_backend
