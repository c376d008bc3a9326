// The gate against what it promises: never more than `limit` inside, callers admitted in
// the order they arrived (each arrives only once the one before is queued, so the order is
// known), and a caller whose deadline passes leaves the queue without holding up the rest.
#include "worker/tier/fifo_gate.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <random>
#include <thread>
#include <vector>

#include "tests/test_util.h"

namespace lazykv {
namespace {

using std::chrono::milliseconds;

void WaitUntilWaiting(const FifoGate& gate, size_t n) {
  while (gate.waiting() < n) std::this_thread::sleep_for(std::chrono::microseconds(100));
}

TEST(FifoGateTest, AtMostLimitInsideAndFirstComeFirstServed) {
  std::mt19937_64 rng(testing::FreshSeed());
  for (const int limit : {1, 2, 3}) {
    SCOPED_TRACE(limit);
    FifoGate gate(limit);
    const auto far = FifoGate::Clock::now() + std::chrono::minutes(5);
    std::atomic<int> inside{0}, most{0};
    auto enter_and_count = [&] {
      const int now = ++inside;
      int seen = most.load();
      while (now > seen && !most.compare_exchange_weak(seen, now)) {
      }
    };
    // Holders fill the gate; then callers queue up one by one behind them.
    for (int h = 0; h < limit; ++h) {
      ASSERT_TRUE(gate.Enter(far).has_value());
      enter_and_count();
    }
    const int n = 8;
    std::vector<int> hold_us(n);
    for (int& us : hold_us) us = 100 + static_cast<int>(rng() % 400);
    std::vector<uint64_t> admitted(n);
    std::vector<std::thread> waiters;
    for (int i = 0; i < n; ++i) {
      waiters.emplace_back([&, i] {
        admitted[i] = *gate.Enter(far);
        enter_and_count();
        std::this_thread::sleep_for(std::chrono::microseconds(hold_us[i]));
        --inside;
        gate.Leave();
      });
      WaitUntilWaiting(gate, static_cast<size_t>(i + 1));  // arrival i is queued
    }
    for (int h = 0; h < limit; ++h) {
      --inside;
      gate.Leave();
    }
    for (auto& t : waiters) t.join();
    EXPECT_LE(most.load(), limit);
    EXPECT_EQ(most.load(), limit);
    for (int i = 0; i < n; ++i) EXPECT_EQ(admitted[i], static_cast<uint64_t>(limit + i)) << i;
  }
}

TEST(FifoGateTest, AWaiterPastItsDeadlineLeavesTheQueueAndTheNextGoesOn) {
  FifoGate gate(1);
  ASSERT_TRUE(gate.Enter(FifoGate::Clock::now()).has_value());  // free: in at once
  std::optional<uint64_t> impatient = uint64_t{99}, patient;
  std::thread first([&] { impatient = gate.Enter(FifoGate::Clock::now() + milliseconds(30)); });
  WaitUntilWaiting(gate, 1);
  std::thread second([&] { patient = gate.Enter(FifoGate::Clock::now() + std::chrono::minutes(5)); });
  first.join();  // its deadline passed while the gate was full
  EXPECT_FALSE(impatient.has_value());
  WaitUntilWaiting(gate, 1);  // the second, queued
  EXPECT_EQ(gate.waiting(), 1u);
  gate.Leave();
  second.join();
  ASSERT_TRUE(patient.has_value());
  EXPECT_EQ(*patient, 1u);  // the second admission ever
  gate.Leave();
}

}  // namespace
}  // namespace lazykv
