#include "common/http_connection_pool.h"

namespace lazykv {
namespace {
thread_local bool t_refusing = false;
}  // namespace

HttpConnectionPool::HttpConnectionPool(size_t threads, size_t max_queued, size_t overflow_threads)
    : threads_serving_(threads), max_queued_(max_queued) {
  for (size_t i = 0; i < threads; ++i) threads_.emplace_back([this] { Work(&serving_, false); });
  for (size_t i = 0; i < overflow_threads; ++i) threads_.emplace_back([this] { Work(&overflow_, true); });
}

HttpConnectionPool::~HttpConnectionPool() { shutdown(); }

void HttpConnectionPool::enqueue(std::function<void()> connection) {
  {
    MutexLock lock(&mu_);
    // Served when a free thread takes it at once or it may wait: the queued connections,
    // this one included, beyond the free threads are at most max_queued. A thread is free
    // unless it is serving a connection (also before it first runs: counting the threads
    // that had reached their wait refused a first connection while one was still starting).
    const size_t free_threads = threads_serving_ - busy_;
    (serving_.size() + 1 <= free_threads + max_queued_ ? serving_ : overflow_).push_back(std::move(connection));
  }
  ready_.SignalAll();
}

void HttpConnectionPool::shutdown() {
  {
    MutexLock lock(&mu_);
    if (shutdown_) return;
    shutdown_ = true;
  }
  ready_.SignalAll();
  for (std::thread& t : threads_) t.join();
}

bool HttpConnectionPool::Refusing() { return t_refusing; }

void HttpConnectionPool::Work(std::deque<std::function<void()>>* jobs, bool refusing) {
  t_refusing = refusing;
  bool served = false;  // a job of this thread's ended since it last held the lock
  for (;;) {
    std::function<void()> job;
    {
      MutexLock lock(&mu_);
      if (served && !refusing) --busy_;
      // The queue is one of the two guarded members; the analysis cannot see through the pointer.
      while (jobs->empty() && !shutdown_) ready_.Wait(&mu_);
      if (jobs->empty()) return;  // shut down and drained
      job = std::move(jobs->front());
      jobs->pop_front();
      if (!refusing) ++busy_;
    }
    job();
    served = true;
  }
}

}  // namespace lazykv
