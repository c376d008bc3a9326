// The host's monotonic clock as a number, for stamps that processes on one host compare (a
// worker's GenerateDone.timings against its client's, bench/served_transit.py):
// std::chrono::steady_clock is CLOCK_MONOTONIC on Linux, one clock for every process of a host.
#pragma once

#include <chrono>
#include <cstdint>

namespace lazykv {

// Nanoseconds of the host's monotonic clock at `t` (now by default).
inline int64_t MonotonicNanos(std::chrono::steady_clock::time_point t = std::chrono::steady_clock::now()) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

}  // namespace lazykv
