// HttpConnectionPool's admission: a connection is served when a serving thread is free or
// it may wait (at most max_queued beyond the free threads); past that the overflow threads
// run it with Refusing() true. Jobs stand in for connections and record what they saw.
#include "common/http_connection_pool.h"

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <thread>

#include "gtest/gtest.h"

namespace lazykv {
namespace {

using namespace std::chrono_literals;

// Enqueues a job that reports whether it was refused and returns the report's future.
std::future<bool> EnqueueReporting(HttpConnectionPool& pool) {
  auto refused = std::make_shared<std::promise<bool>>();
  std::future<bool> result = refused->get_future();
  pool.enqueue([refused] { refused->set_value(HttpConnectionPool::Refusing()); });
  return result;
}

// A connection that arrives before the one serving thread has first run is served, not
// refused: the thread is free although it has not reached its wait (a worker answering its
// first request with 429 on a loaded machine). Many fresh pools, each enqueued at once.
TEST(HttpConnectionPoolTest, AConnectionAtOnceAfterStartIsServed) {
  for (int i = 0; i < 50; ++i) {
    HttpConnectionPool pool(/*threads=*/1, /*max_queued=*/0, /*overflow_threads=*/1);
    std::future<bool> refused = EnqueueReporting(pool);
    ASSERT_EQ(refused.wait_for(10s), std::future_status::ready);
    EXPECT_FALSE(refused.get()) << "pool " << i;
  }
}

// One thread held by a long connection and one place to wait: the next connection waits and
// is served after it, the one after that is refused at once, while the first still holds.
TEST(HttpConnectionPoolTest, PastTheThreadsAndTheQueueIsRefusedAtOnce) {
  HttpConnectionPool pool(/*threads=*/1, /*max_queued=*/1, /*overflow_threads=*/1);
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::promise<bool> holder_refused;
  std::future<bool> holder = holder_refused.get_future();
  std::atomic<bool> holding{false};
  pool.enqueue([&] {
    holder_refused.set_value(HttpConnectionPool::Refusing());
    holding = true;
    released.wait();
  });
  const auto give_up = std::chrono::steady_clock::now() + 10s;
  while (!holding && std::chrono::steady_clock::now() < give_up) std::this_thread::sleep_for(1ms);
  ASSERT_TRUE(holding);
  std::future<bool> waiting = EnqueueReporting(pool);
  std::future<bool> past = EnqueueReporting(pool);
  ASSERT_EQ(past.wait_for(10s), std::future_status::ready) << "refused at once, while the holder holds";
  EXPECT_TRUE(past.get());
  EXPECT_EQ(waiting.wait_for(50ms), std::future_status::timeout) << "the queued one waits for the thread";
  release.set_value();
  ASSERT_EQ(waiting.wait_for(10s), std::future_status::ready);
  EXPECT_FALSE(waiting.get());
  EXPECT_FALSE(holder.get());
}

// A thread whose connection ended serves again: its busy count is given back.
TEST(HttpConnectionPoolTest, AThreadIsFreeAgainAfterItsConnection) {
  HttpConnectionPool pool(/*threads=*/1, /*max_queued=*/0, /*overflow_threads=*/1);
  for (int round = 0; round < 5; ++round) {
    // The thread gives its count back when it next takes the lock, just after the job: a
    // connection in that instant is refused, so each round tries for a while.
    bool served = false;
    const auto give_up = std::chrono::steady_clock::now() + 10s;
    while (!served && std::chrono::steady_clock::now() < give_up) {
      std::future<bool> refused = EnqueueReporting(pool);
      ASSERT_EQ(refused.wait_for(10s), std::future_status::ready);
      served = !refused.get();
      if (!served) std::this_thread::sleep_for(1ms);
    }
    EXPECT_TRUE(served) << "round " << round;
  }
}

}  // namespace
}  // namespace lazykv
