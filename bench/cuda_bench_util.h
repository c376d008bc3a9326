// Shared by the GPU benchmarks: fail-fast CUDA calls, uploads, and median event timing.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <utility>
#include <vector>

#include "absl/status/status.h"

#define CHECK_CUDA(expr)                                                                        \
  do {                                                                                          \
    cudaError_t e = (expr);                                                                     \
    if (e != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e)); \
      std::exit(1);                                                                             \
    }                                                                                           \
  } while (0)

namespace lazykv::bench {

// Ends the run with the failing call's status on stderr.
inline void CheckOk(const absl::Status& status, const char* what) {
  if (status.ok()) return;
  std::fprintf(stderr, "%s: %s\n", what, status.ToString().c_str());
  std::exit(1);
}

template <typename T>
T* Upload(const std::vector<T>& v) {
  T* d;
  CHECK_CUDA(cudaMalloc(&d, std::max<size_t>(1, v.size()) * sizeof(T)));
  CHECK_CUDA(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

// Median over `reps` timed runs of fn() (after 3 warm-up runs), in milliseconds.
template <typename Fn>
float MedianMs(Fn&& fn, int reps = 30, cudaStream_t stream = nullptr) {
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) fn();
  std::vector<float> times;
  for (int i = 0; i < reps; ++i) {
    cudaEventRecord(a, stream);
    fn();
    cudaEventRecord(b, stream);
    cudaEventSynchronize(b);
    float ms;
    cudaEventElapsedTime(&ms, a, b);
    times.push_back(ms);
  }
  CHECK_CUDA(cudaEventDestroy(a));
  CHECK_CUDA(cudaEventDestroy(b));
  std::nth_element(times.begin(), times.begin() + reps / 2, times.end());
  return times[reps / 2];
}

// Medians of two workloads timed alternately (a b a b ...), after at least 50 ms of both as
// warm-up: their ratio is not skewed by clocks that change between two separate loops. An
// untimed run of b leads each pair, so the GPU is busy while the timed launches are queued
// and neither time includes the host's launch latency.
template <typename FnA, typename FnB>
std::pair<float, float> AlternatedMedianMs(FnA&& fn_a, FnB&& fn_b, int reps = 40, cudaStream_t stream = nullptr) {
  cudaEvent_t e[3];
  for (auto& ev : e) CHECK_CUDA(cudaEventCreate(&ev));
  std::vector<float> times[2];
  const auto run_pair = [&] {
    fn_b();
    cudaEventRecord(e[0], stream);
    fn_a();
    cudaEventRecord(e[1], stream);
    fn_b();
    cudaEventRecord(e[2], stream);
    cudaEventSynchronize(e[2]);
    float a_ms, b_ms;
    cudaEventElapsedTime(&a_ms, e[0], e[1]);
    cudaEventElapsedTime(&b_ms, e[1], e[2]);
    return std::make_pair(a_ms, b_ms);
  };
  for (float warm_ms = 0.0f; warm_ms < 50.0f;) {
    const auto [a_ms, b_ms] = run_pair();
    warm_ms += a_ms + b_ms;
  }
  for (int i = 0; i < reps; ++i) {
    const auto [a_ms, b_ms] = run_pair();
    times[0].push_back(a_ms);
    times[1].push_back(b_ms);
  }
  for (auto& ev : e) CHECK_CUDA(cudaEventDestroy(ev));
  for (auto& t : times) std::nth_element(t.begin(), t.begin() + reps / 2, t.end());
  return {times[0][reps / 2], times[1][reps / 2]};
}

// Median time of one launch, from `replays` graph replays of 10 launches (no launch gaps).
template <typename Launch>
float GraphMedianMs(Launch&& launch, int replays = 20) {
  constexpr int kPerGraph = 10;
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  launch(stream);
  CHECK_CUDA(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < kPerGraph; ++i) launch(stream);
  CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  const float ms = MedianMs([&] { cudaGraphLaunch(exec, stream); }, replays, stream) / kPerGraph;
  CHECK_CUDA(cudaGraphExecDestroy(exec));
  CHECK_CUDA(cudaGraphDestroy(graph));
  CHECK_CUDA(cudaStreamDestroy(stream));
  return ms;
}

// Fills a bf16 pool with random normal values: a 32 MB random block (drawn once per
// process) copied over the pool.
inline void FillRandomBf16(void* pool, size_t elems, std::mt19937& rng) {
  static std::vector<__nv_bfloat16> block;
  if (block.empty()) {
    block.resize(size_t{16} << 20);
    std::normal_distribution<float> dist;
    for (auto& x : block) x = __float2bfloat16(dist(rng));
  }
  auto* dst = static_cast<__nv_bfloat16*>(pool);
  for (size_t done = 0; done < elems; done += block.size()) {
    const size_t n = std::min(block.size(), elems - done);
    CHECK_CUDA(cudaMemcpy(dst + done, block.data(), n * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice));
  }
}

}  // namespace lazykv::bench
