// A bounded thread pool for cpp-httplib connections. httplib's own pool queues accepted
// connections without limit, so a burst of long streaming requests would leave later
// clients waiting in silence; here at most `max_queued` connections wait for one of the
// `threads`, and a connection past that is served by a small overflow pool whose handlers
// see Refusing() true and answer at once (429 with Retry-After, connection closed).
#pragma once

#include <httplib.h>

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "common/mutex.h"

namespace lazykv {

// Thread-safe (httplib's accept thread enqueues, the pools' threads run).
class HttpConnectionPool : public httplib::TaskQueue {
 public:
  HttpConnectionPool(size_t threads, size_t max_queued, size_t overflow_threads = 2);
  ~HttpConnectionPool() override;

  void enqueue(std::function<void()> connection) override ABSL_LOCKS_EXCLUDED(mu_);
  void shutdown() override ABSL_LOCKS_EXCLUDED(mu_);

  // Whether the calling handler serves a connection past the limit (it must refuse it).
  static bool Refusing();

 private:
  void Work(std::deque<std::function<void()>>* jobs, bool refusing) ABSL_LOCKS_EXCLUDED(mu_);

  const size_t threads_serving_;
  const size_t max_queued_;
  Mutex mu_;
  CondVar ready_;  // a job was queued, or shutdown
  std::deque<std::function<void()>> serving_ ABSL_GUARDED_BY(mu_);
  std::deque<std::function<void()>> overflow_ ABSL_GUARDED_BY(mu_);
  size_t busy_ ABSL_GUARDED_BY(mu_) = 0;  // serving threads running a connection
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;  // set in the constructor, joined by shutdown()
};

}  // namespace lazykv
