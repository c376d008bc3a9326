// At most `limit` callers inside at once, let in in the order they came (first come, first
// served: a ticket each). The chunk pipeline stages fetched chunks through one, so a burst of
// fetches shares the host-to-device link a few at a time, earliest request first, instead of
// every chunk crawling at a fraction of the bandwidth. Thread-safe.
#pragma once

#include <cstdint>

#include "common/mutex.h"

namespace lazykv {

class FifoGate {
 public:
  explicit FifoGate(int limit) : limit_(limit < 1 ? 1 : limit) {}

  // Waits for the caller's turn. Every Enter is paired with one Leave.
  void Enter() ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    const uint64_t ticket = next_ticket_++;
    // Tickets enter in order, so `left_` leaves mean tickets below left_ + limit may be in.
    while (ticket >= left_ + static_cast<uint64_t>(limit_)) turn_.Wait(&mu_);
  }
  void Leave() ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    ++left_;
    turn_.SignalAll();
  }

  // Enter for a scope.
  class Pass {
   public:
    explicit Pass(FifoGate& gate) : gate_(gate) { gate_.Enter(); }
    ~Pass() { gate_.Leave(); }
    Pass(const Pass&) = delete;
    Pass& operator=(const Pass&) = delete;

   private:
    FifoGate& gate_;
  };

 private:
  const int limit_;
  Mutex mu_;
  CondVar turn_;
  uint64_t next_ticket_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t left_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace lazykv
