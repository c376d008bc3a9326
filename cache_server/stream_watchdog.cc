#include "cache_server/stream_watchdog.h"

#include <algorithm>

namespace lazykv::cache {

StreamWatchdog::StreamWatchdog(std::chrono::milliseconds idle_timeout)
    : idle_timeout_(idle_timeout), thread_([this] { Scan(); }) {}

StreamWatchdog::~StreamWatchdog() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  wake_.SignalAll();
  thread_.join();
}

StreamWatchdog::Watch::Watch(StreamWatchdog* dog, grpc::ServerContext* context) : dog_(dog) {
  MutexLock lock(&dog_->mu_);
  id_ = dog_->next_id_++;
  dog_->entries_.emplace(id_, Entry{context, Clock::now()});
}

StreamWatchdog::Watch::~Watch() {
  // Under the lock, so a scan never cancels a context its handler has left.
  MutexLock lock(&dog_->mu_);
  dog_->entries_.erase(id_);
}

void StreamWatchdog::Watch::Progress() {
  MutexLock lock(&dog_->mu_);
  dog_->entries_.at(id_).last_progress = Clock::now();
}

bool StreamWatchdog::Watch::timed_out() const {
  MutexLock lock(&dog_->mu_);
  return dog_->entries_.at(id_).cancelled;
}

void StreamWatchdog::Scan() {
  // A call is cancelled between idle_timeout and idle_timeout + one period after its last
  // progress.
  const auto period = std::clamp<std::chrono::milliseconds>(idle_timeout_ / 4, std::chrono::milliseconds(5),
                                                            std::chrono::milliseconds(250));
  MutexLock lock(&mu_);
  while (!stopping_) {
    wake_.WaitUntil(&mu_, Clock::now() + period);
    const auto now = Clock::now();
    for (auto& [id, entry] : entries_) {
      if (entry.cancelled || now - entry.last_progress < idle_timeout_) continue;
      entry.cancelled = true;
      entry.context->TryCancel();
    }
  }
}

}  // namespace lazykv::cache
