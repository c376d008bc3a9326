// MeasureSmClockMhz (bench/sm_clock.h) against the device's own figures: the reading lies
// between a tenth of the largest SM clock the driver reports and that clock (plus 5%), and a
// kernel that spins for a known number of cycles takes about that many cycles / reading of
// wall time. Units gone wrong (kHz, microseconds) land a factor of 1000 off; a window that is
// not waited for reads 0 cycles. Skips without a GPU.
#include <cuda_runtime.h>

#include <algorithm>

#include "bench/sm_clock.h"
#include "gtest/gtest.h"
#include "tests/bench/spin_cycles.h"
#include "tests/kernels/cuda_test_util.h"

namespace lazykv::testing {
namespace {

TEST(SmClockTest, ReadingIsWithinTheDeviceClockRange) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  int max_khz = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&max_khz, cudaDevAttrClockRate, 0), cudaSuccess);
  float mhz = 0.0f;
  ASSERT_EQ(bench::MeasureSmClockMhz(nullptr, 200, &mhz), cudaSuccess);
  EXPECT_GT(mhz, 0.1f * max_khz / 1e3f);
  EXPECT_LT(mhz, 1.05f * max_khz / 1e3f);
  EXPECT_EQ(bench::MeasureSmClockMhz(nullptr, 0, &mhz), cudaErrorInvalidValue);
}

TEST(SmClockTest, SpinOfKnownCyclesTakesTheMatchingTime) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  // 200 ms of spinning at the reading's clock, timed by events; the clock is read before and
  // after, and the time must match within the two readings' range (plus 10%).
  float before = 0.0f, after = 0.0f;
  ASSERT_EQ(bench::MeasureSmClockMhz(nullptr, 200, &before), cudaSuccess);
  const long long cycles = static_cast<long long>(before * 1e3) * 200;
  cudaEvent_t a, b;
  ASSERT_EQ(cudaEventCreate(&a), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&b), cudaSuccess);
  cudaEventRecord(a);
  ASSERT_EQ(LaunchSpinCycles(cycles, nullptr), cudaSuccess);
  cudaEventRecord(b);
  ASSERT_EQ(cudaEventSynchronize(b), cudaSuccess);
  float ms = 0.0f;
  cudaEventElapsedTime(&ms, a, b);
  ASSERT_EQ(bench::MeasureSmClockMhz(nullptr, 200, &after), cudaSuccess);
  const float lo = std::min(before, after), hi = std::max(before, after);
  const double expected_lo = cycles / (hi * 1e3), expected_hi = cycles / (lo * 1e3);
  EXPECT_GT(ms, 0.9 * expected_lo) << "clock " << before << " / " << after << " MHz";
  EXPECT_LT(ms, 1.1 * expected_hi) << "clock " << before << " / " << after << " MHz";
  cudaEventDestroy(a);
  cudaEventDestroy(b);
}

}  // namespace
}  // namespace lazykv::testing
