// At most `limit` callers inside at once, let in in the order they came (first come, first
// served), each waiting until a deadline at most. The chunk pipeline stages fetched chunks
// through one, so a burst of fetches shares the host-to-device link a few at a time,
// earliest request first, instead of every chunk crawling at a fraction of the bandwidth.
// Thread-safe.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>

#include "common/mutex.h"

namespace lazykv {

class FifoGate {
 public:
  using Clock = std::chrono::steady_clock;
  explicit FifoGate(int limit) : limit_(limit < 1 ? 1 : limit) {}

  // Waits for the caller's turn until `deadline`. Returns the caller's place in the order
  // of admissions (0 for the first caller ever let in), or nullopt at the deadline (the
  // caller is out of the queue then, and must not Leave). Every admission is paired with
  // one Leave.
  std::optional<uint64_t> Enter(Clock::time_point deadline) ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    const uint64_t ticket = next_ticket_++;
    queue_.push_back(ticket);
    while (!(inside_ < limit_ && queue_.front() == ticket)) {
      if (Clock::now() >= deadline) {
        queue_.erase(std::find(queue_.begin(), queue_.end(), ticket));
        turn_.SignalAll();  // the one behind may be at the front now
        return std::nullopt;
      }
      turn_.WaitUntil(&mu_, deadline);
    }
    queue_.pop_front();
    ++inside_;
    turn_.SignalAll();  // the next in line may fit too
    return admitted_++;
  }
  void Leave() ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    --inside_;
    turn_.SignalAll();
  }
  // Callers waiting for their turn (tests).
  size_t waiting() const ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    return queue_.size();
  }

 private:
  const int limit_;
  mutable Mutex mu_;
  CondVar turn_;
  std::deque<uint64_t> queue_ ABSL_GUARDED_BY(mu_);  // tickets waiting, in arrival order
  uint64_t next_ticket_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t admitted_ ABSL_GUARDED_BY(mu_) = 0;
  int inside_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace lazykv
