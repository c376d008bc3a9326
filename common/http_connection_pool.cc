#include "common/http_connection_pool.h"

namespace lazykv {
namespace {
thread_local bool t_refusing = false;
}  // namespace

HttpConnectionPool::HttpConnectionPool(size_t threads, size_t max_queued, size_t overflow_threads)
    : max_queued_(max_queued) {
  for (size_t i = 0; i < threads; ++i) threads_.emplace_back([this] { Work(&serving_, false); });
  for (size_t i = 0; i < overflow_threads; ++i) threads_.emplace_back([this] { Work(&overflow_, true); });
}

HttpConnectionPool::~HttpConnectionPool() { shutdown(); }

void HttpConnectionPool::enqueue(std::function<void()> connection) {
  {
    MutexLock lock(&mu_);
    // Served when an idle thread takes it at once or it may wait: the queued connections,
    // this one included, beyond the idle threads are at most max_queued.
    (serving_.size() + 1 <= idle_ + max_queued_ ? serving_ : overflow_).push_back(std::move(connection));
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
  for (;;) {
    std::function<void()> job;
    {
      MutexLock lock(&mu_);
      if (!refusing) ++idle_;
      // The queue is one of the two guarded members; the analysis cannot see through the pointer.
      while (jobs->empty() && !shutdown_) ready_.Wait(&mu_);
      if (!refusing) --idle_;
      if (jobs->empty()) return;  // shut down and drained
      job = std::move(jobs->front());
      jobs->pop_front();
    }
    job();
  }
}

}  // namespace lazykv
