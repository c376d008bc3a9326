// A kernel for the SM clock probe's test (cuda_sm_clock_test): one thread spins until its SM
// has counted `cycles` cycles (clock64).
#pragma once

#include <cuda_runtime.h>

namespace lazykv::testing {

cudaError_t LaunchSpinCycles(long long cycles, cudaStream_t stream);

}  // namespace lazykv::testing
