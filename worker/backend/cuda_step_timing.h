// Where a small decode step's time goes inside the CUDA backend, measured on every such step
// (issue 25's batch-1 decode): the host's work before the step's first GPU operation (its
// metadata), the GPU timeline from that operation to the end of sampling (kernels and the
// gaps between them, including any wait for the host's launches), and the whole call. The
// engine's own time between calls is the step interval minus the call. Costs two event
// records a step. Not thread-safe: the scheduling thread's.
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <string>

namespace lazykv::cuda_backend {

class StepTiming {
 public:
  StepTiming() = default;
  ~StepTiming();
  StepTiming(const StepTiming&) = delete;
  StepTiming& operator=(const StepTiming&) = delete;

  // A timed call starts (host clock).
  void Begin();
  // Its first GPU operation is about to be enqueued on `stream`.
  void MarkFirstLaunch(cudaStream_t stream);
  // Its last GPU operation has been enqueued on `stream`.
  void MarkLastLaunch(cudaStream_t stream);
  // After the stream has been synchronized: the call ends; its figures are added.
  void End();
  // The call failed, or is not timed: nothing is added, and no state is left for the next.
  void Abort() { active_ = launched_ = finished_ = false; }
  bool active() const { return active_; }

  // "small decode steps: N, per step: host before the first launch X ms, GPU from it to the
  // sampled tokens Y ms, the call Z ms", or "" before any.
  std::string Summary() const;

 private:
  cudaEvent_t first_ = nullptr, last_ = nullptr;
  bool active_ = false, launched_ = false, finished_ = false;
  std::chrono::steady_clock::time_point begin_, first_launch_;
  long steps_ = 0;
  double host_ms_ = 0, gpu_ms_ = 0, call_ms_ = 0;
};

}  // namespace lazykv::cuda_backend
