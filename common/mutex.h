// The project's mutex and condition variable: std::mutex and std::condition_variable
// behind Abseil's thread-safety annotations.
//
// Why not absl::Mutex: clang's -Wthread-safety needs an annotated capability type, which
// libstdc++'s std::mutex is not; and ThreadSanitizer must see the synchronization, which
// it does for pthread calls (std::mutex) but not inside Debian's uninstrumented Abseil.
// This header gives both (the same shape as leveldb's port::Mutex).
//
// Use: annotate what a mutex guards with ABSL_GUARDED_BY(mu_) and methods that expect it
// held with ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_); the clang build (scripts/check_threads.sh)
// rejects any access the annotations do not allow.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "absl/base/thread_annotations.h"

namespace lazykv {

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  // Tells the analysis that the caller holds the mutex (it checks nothing at run time).
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds a Mutex for its scope. Unlock() and Lock() let a loop drop it around slow work.
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() {
    if (held_) mu_->Unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  // REQUIRES: held (the constructor's lock, or a Lock() after an Unlock()).
  void Unlock() ABSL_UNLOCK_FUNCTION() {
    mu_->Unlock();
    held_ = false;
  }
  // REQUIRES: not held (after Unlock()).
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() {
    mu_->Lock();
    held_ = true;
  }

 private:
  Mutex* const mu_;
  bool held_ = true;
};

// A condition variable over a Mutex. Waits may wake spuriously: callers loop on their
// condition (`while (!ready) cv.Wait(&mu);`), which also keeps the condition's reads in
// code the analysis checks.
class CondVar {
 public:
  // REQUIRES: `mu` held; it is released while waiting and held again on return.
  void Wait(Mutex* mu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();
  }
  // As Wait; false when `deadline` passed first.
  template <typename Clock, typename Duration>
  bool WaitUntil(Mutex* mu, std::chrono::time_point<Clock, Duration> deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    const bool woken = cv_.wait_until(lock, deadline) == std::cv_status::no_timeout;
    lock.release();
    return woken;
  }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace lazykv
