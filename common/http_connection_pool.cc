#include "common/http_connection_pool.h"

namespace lazykv {
namespace {
thread_local bool t_refusing = false;
}  // namespace

HttpConnectionPool::HttpConnectionPool(size_t threads, size_t max_queued, size_t overflow_threads)
    : max_queued_(max_queued) {
  for (size_t i = 0; i < threads; ++i) serving_.threads.emplace_back([this] { Work(serving_, false); });
  for (size_t i = 0; i < overflow_threads; ++i) overflow_.threads.emplace_back([this] { Work(overflow_, true); });
}

HttpConnectionPool::~HttpConnectionPool() { shutdown(); }

void HttpConnectionPool::enqueue(std::function<void()> connection) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Waiting connections beyond the idle threads that will take them at once.
    const size_t waiting = serving_.jobs.size() >= idle_ ? serving_.jobs.size() - idle_ : 0;
    (waiting < max_queued_ ? serving_ : overflow_).jobs.push_back(std::move(connection));
  }
  ready_.notify_all();
}

void HttpConnectionPool::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutdown_) return;
    shutdown_ = true;
  }
  ready_.notify_all();
  for (Lane* lane : {&serving_, &overflow_}) {
    for (std::thread& t : lane->threads) t.join();
  }
}

bool HttpConnectionPool::Refusing() { return t_refusing; }

void HttpConnectionPool::Work(Lane& lane, bool refusing) {
  t_refusing = refusing;
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (!refusing) ++idle_;
      ready_.wait(lock, [&] { return !lane.jobs.empty() || shutdown_; });
      if (!refusing) --idle_;
      if (lane.jobs.empty()) return;  // shut down and drained
      job = std::move(lane.jobs.front());
      lane.jobs.pop_front();
    }
    job();
  }
}

}  // namespace lazykv
