#include <cstdint>

#include "bench/sm_clock.h"

namespace lazykv::bench {
namespace {

__device__ __forceinline__ uint64_t GlobalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// out[0]: SM cycles, out[1]: nanoseconds of the global timer, over at least window_ns.
__global__ void CountCyclesKernel(uint64_t window_ns, unsigned long long* out) {
  const uint64_t t0 = GlobalTimerNs();
  const long long c0 = clock64();
  uint64_t t1 = t0;
  while (t1 - t0 < window_ns) t1 = GlobalTimerNs();
  const long long c1 = clock64();
  out[0] = static_cast<unsigned long long>(c1 - c0);
  out[1] = t1 - t0;
}

}  // namespace

cudaError_t MeasureSmClockMhz(cudaStream_t stream, int window_us, float* mhz) {
  if (window_us <= 0) return cudaErrorInvalidValue;
  unsigned long long* counts = nullptr;
  if (cudaError_t e = cudaMalloc(&counts, 2 * sizeof(unsigned long long)); e != cudaSuccess) return e;
  CountCyclesKernel<<<1, 1, 0, stream>>>(static_cast<uint64_t>(window_us) * 1000, counts);
  unsigned long long host[2] = {0, 0};
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) e = cudaMemcpyAsync(host, counts, sizeof(host), cudaMemcpyDeviceToHost, stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
  cudaFree(counts);
  if (e != cudaSuccess) return e;
  if (host[1] == 0) return cudaErrorUnknown;
  *mhz = static_cast<float>(1e3 * static_cast<double>(host[0]) / static_cast<double>(host[1]));
  return cudaSuccess;
}

}  // namespace lazykv::bench
