// A fixed pool of threads with a bounded queue: the chunk pipeline's way to run blocking
// tier calls without one thread per chunk and without ever blocking the caller.
#pragma once

#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"

namespace lazykv {

// Thread-safe. The destructor runs every task still queued, then joins the threads.
class BoundedExecutor {
 public:
  BoundedExecutor(int threads, size_t max_queued);
  ~BoundedExecutor();
  BoundedExecutor(const BoundedExecutor&) = delete;
  BoundedExecutor& operator=(const BoundedExecutor&) = delete;

  // Queues `task` unless max_queued tasks already wait; false (task dropped) if so.
  bool TrySubmit(std::function<void()> task) ABSL_LOCKS_EXCLUDED(mu_);
  // Queues `task` past the bound (small bookkeeping tasks that must not be lost).
  void Submit(std::function<void()> task) ABSL_LOCKS_EXCLUDED(mu_);
  size_t queued() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  const size_t max_queued_;
  mutable Mutex mu_;
  CondVar work_;  // tasks_ gained a task, or stopping_
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace lazykv
