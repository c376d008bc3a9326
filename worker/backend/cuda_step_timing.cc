#include "worker/backend/cuda_step_timing.h"

#include "absl/strings/str_format.h"

namespace lazykv::cuda_backend {

StepTiming::~StepTiming() {
  if (first_ != nullptr) cudaEventDestroy(first_);
  if (last_ != nullptr) cudaEventDestroy(last_);
}

void StepTiming::Begin() {
  Abort();
  if (first_ == nullptr || last_ == nullptr) {
    if (first_ == nullptr && cudaEventCreate(&first_) != cudaSuccess) first_ = nullptr;
    if (last_ == nullptr && cudaEventCreate(&last_) != cudaSuccess) last_ = nullptr;
    if (first_ == nullptr || last_ == nullptr) {
      cudaGetLastError();
      return;  // no timing without both events (tried again at the next Begin)
    }
  }
  active_ = true;
  launched_ = finished_ = false;
  begin_ = std::chrono::steady_clock::now();
}

void StepTiming::MarkFirstLaunch(cudaStream_t stream) {
  if (!active_ || launched_) return;
  launched_ = true;
  first_launch_ = std::chrono::steady_clock::now();
  cudaEventRecord(first_, stream);
}

void StepTiming::MarkLastLaunch(cudaStream_t stream) {
  if (!active_ || !launched_) return;
  finished_ = true;
  cudaEventRecord(last_, stream);
}

void StepTiming::End() {
  if (!active_) return;
  const bool complete = launched_ && finished_;
  Abort();
  float gpu_ms = 0;
  if (!complete || cudaEventElapsedTime(&gpu_ms, first_, last_) != cudaSuccess) {
    cudaGetLastError();
    return;  // not counted
  }
  const auto now = std::chrono::steady_clock::now();
  ++steps_;
  host_ms_ += std::chrono::duration<double, std::milli>(first_launch_ - begin_).count();
  gpu_ms_ += gpu_ms;
  call_ms_ += std::chrono::duration<double, std::milli>(now - begin_).count();
}

std::string StepTiming::Summary() const {
  if (steps_ == 0) return "";
  return absl::StrFormat(
      "small decode steps: %d, per step: host before the first launch %.3f ms, GPU from it to the sampled tokens "
      "%.3f ms, the call %.3f ms",
      steps_, host_ms_ / steps_, gpu_ms_ / steps_, call_ms_ / steps_);
}

}  // namespace lazykv::cuda_backend
