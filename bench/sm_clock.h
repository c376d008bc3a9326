// The GPU's SM clock as the benchmarks ran, read on the device. A lent H200 runs these
// benchmarks at its power cap (bench/results/prefill_half_master_2026-11-30.md: 690-700 W,
// throttle reason "SW power cap"), where the clock (1.70-1.98 GHz there) follows the power of
// the kernels run in the seconds before: two builds compared in turn can differ by their clock
// as much as by their code. A reading right after a timed loop labels that loop's figures.
#pragma once

#include <cuda_runtime.h>

namespace lazykv::bench {

// The SM clock in MHz: one thread counts its SM's cycles (clock64) over `window_us` of the
// GPU's global timer (nanoseconds; its updates come about every microsecond, so a 200 us window
// errs by under 1%). Launched on `stream` and waited for; *mhz is set only on success.
// Precondition: window_us > 0. Thread-safe (no shared state).
cudaError_t MeasureSmClockMhz(cudaStream_t stream, int window_us, float* mhz);

}  // namespace lazykv::bench
