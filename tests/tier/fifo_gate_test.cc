// The gate against what it promises: never more than `limit` inside, and callers let in in
// the order they arrived (arrivals spaced out so their order is known).
#include "worker/tier/fifo_gate.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "tests/test_util.h"

namespace lazykv {
namespace {

TEST(FifoGateTest, AtMostLimitInsideAndFirstComeFirstServed) {
  std::mt19937_64 rng(testing::FreshSeed());
  for (const int limit : {1, 2, 3}) {
    SCOPED_TRACE(limit);
    FifoGate gate(limit);
    std::atomic<int> inside{0}, most{0};
    std::mutex order_mu;
    std::vector<int> order;
    // A holder keeps the gate full while the others queue up one by one.
    std::vector<std::thread> holders;
    std::atomic<bool> release{false};
    for (int h = 0; h < limit; ++h) {
      holders.emplace_back([&] {
        FifoGate::Pass pass(gate);
        ++inside;
        while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        --inside;
      });
    }
    while (inside < limit) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const int n = 8;
    std::vector<int> hold_us(n);
    for (int& us : hold_us) us = 200 + static_cast<int>(rng() % 300);
    std::vector<std::thread> waiters;
    for (int i = 0; i < n; ++i) {
      waiters.emplace_back([&, i] {
        FifoGate::Pass pass(gate);
        const int now = ++inside;
        int seen = most.load();
        while (now > seen && !most.compare_exchange_weak(seen, now)) {
        }
        {
          std::lock_guard<std::mutex> lock(order_mu);
          order.push_back(i);
        }
        std::this_thread::sleep_for(std::chrono::microseconds(hold_us[i]));
        --inside;
      });
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // arrive in order i
    }
    release = true;
    for (auto& t : holders) t.join();
    for (auto& t : waiters) t.join();
    EXPECT_LE(most.load(), limit);
    ASSERT_EQ(order.size(), static_cast<size_t>(n));
    if (limit == 1) {
      for (int i = 0; i < n; ++i) EXPECT_EQ(order[i], i);
    } else {
      // Several inside at once may record out of order, but never by more than the limit.
      for (int i = 0; i < n; ++i) EXPECT_LE(std::abs(order[i] - i), limit - 1) << i;
    }
  }
}

}  // namespace
}  // namespace lazykv
