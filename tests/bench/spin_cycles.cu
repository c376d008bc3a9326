#include "tests/bench/spin_cycles.h"

namespace lazykv::testing {
namespace {

__global__ void SpinCyclesKernel(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

}  // namespace

cudaError_t LaunchSpinCycles(long long cycles, cudaStream_t stream) {
  SpinCyclesKernel<<<1, 1, 0, stream>>>(cycles);
  return cudaGetLastError();
}

}  // namespace lazykv::testing
