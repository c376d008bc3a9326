#include "worker/tier/bounded_executor.h"

namespace lazykv {

BoundedExecutor::BoundedExecutor(int threads, size_t max_queued) : max_queued_(max_queued) {
  for (int i = 0; i < std::max(1, threads); ++i) threads_.emplace_back([this] { Loop(); });
}

BoundedExecutor::~BoundedExecutor() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  work_.SignalAll();
  for (std::thread& t : threads_) t.join();
}

bool BoundedExecutor::TrySubmit(std::function<void()> task) {
  {
    MutexLock lock(&mu_);
    if (tasks_.size() >= max_queued_) return false;
    tasks_.push_back(std::move(task));
  }
  work_.Signal();
  return true;
}

void BoundedExecutor::Submit(std::function<void()> task) {
  {
    MutexLock lock(&mu_);
    tasks_.push_back(std::move(task));
  }
  work_.Signal();
}

size_t BoundedExecutor::queued() const {
  MutexLock lock(&mu_);
  return tasks_.size();
}

void BoundedExecutor::Loop() {
  MutexLock lock(&mu_);
  while (true) {
    while (!stopping_ && tasks_.empty()) work_.Wait(&mu_);
    if (tasks_.empty()) return;  // stopping, and nothing left to run
    std::function<void()> task = std::move(tasks_.front());
    tasks_.pop_front();
    lock.Unlock();
    task();
    task = nullptr;  // captured state dies outside the lock
    lock.Lock();
  }
}

}  // namespace lazykv
