// A bounded thread pool for cpp-httplib connections. httplib's own pool queues accepted
// connections without limit, so a burst of long streaming requests would leave later
// clients waiting in silence; here at most `max_queued` connections wait for one of the
// `threads`, and a connection past that is served by a small overflow pool whose handlers
// see Refusing() true and answer at once (429 with Retry-After, connection closed).
#pragma once

#include <httplib.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace lazykv {

// Thread-safe (httplib's accept thread enqueues, the pools' threads run).
class HttpConnectionPool : public httplib::TaskQueue {
 public:
  HttpConnectionPool(size_t threads, size_t max_queued, size_t overflow_threads = 2);
  ~HttpConnectionPool() override;

  void enqueue(std::function<void()> connection) override;
  void shutdown() override;

  // Whether the calling handler serves a connection past the limit (it must refuse it).
  static bool Refusing();

 private:
  struct Lane {
    std::deque<std::function<void()>> jobs;
    std::vector<std::thread> threads;
  };
  void Work(Lane& lane, bool refusing);

  const size_t max_queued_;
  std::mutex mu_;
  std::condition_variable ready_;
  Lane serving_, overflow_;
  size_t idle_ = 0;  // serving threads waiting for a job
  bool shutdown_ = false;
};

}  // namespace lazykv
