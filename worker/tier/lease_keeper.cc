#include "worker/tier/lease_keeper.h"

#include <spdlog/spdlog.h>

#include <vector>

namespace lazykv {

LeaseKeeper::LeaseKeeper(ChunkTier* tier, std::chrono::milliseconds max_hold)
    : tier_(tier), max_hold_(max_hold), thread_([this] { Loop(); }) {}

LeaseKeeper::~LeaseKeeper() {
  stop_requested_ = true;
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  changed_.SignalAll();
  thread_.join();
}

void LeaseKeeper::Keep(const Hash128& key, uint64_t lease_id, std::chrono::milliseconds ttl) {
  if (lease_id == 0) return;
  const Clock::time_point now = Clock::now();
  {
    MutexLock lock(&mu_);
    held_[key] = Held{lease_id, ttl, now + ttl / 3, now + max_hold_};
  }
  changed_.SignalAll();
}

void LeaseKeeper::Forget(const Hash128& key, uint64_t lease_id) {
  MutexLock lock(&mu_);
  if (auto it = held_.find(key); it != held_.end() && it->second.lease_id == lease_id) held_.erase(it);
}

size_t LeaseKeeper::held() const {
  MutexLock lock(&mu_);
  return held_.size();
}

LeaseKeeperStats LeaseKeeper::stats() const {
  MutexLock lock(&mu_);
  return stats_;
}

void LeaseKeeper::Loop() {
  MutexLock lock(&mu_);
  while (!stopping_) {
    const Clock::time_point now = Clock::now();
    Clock::time_point next = now + std::chrono::hours(1);
    std::vector<std::pair<Hash128, Held>> due;
    for (auto it = held_.begin(); it != held_.end();) {
      if (now >= it->second.give_up) {
        ++stats_.abandoned;
        spdlog::warn("lease on chunk {} held for {} ms without a publication: no longer renewed", it->first.ToHex(),
                     max_hold_.count());
        it = held_.erase(it);
        continue;
      }
      if (now >= it->second.next_renewal) {
        due.emplace_back(it->first, it->second);
        it->second.next_renewal = now + it->second.ttl / 3;
      }
      next = std::min(next, it->second.next_renewal);
      ++it;
    }
    if (!due.empty()) {
      // Renew without the lock: a slow tier must not hold up Keep and Forget.
      lock.Unlock();
      std::vector<std::pair<Hash128, Held>> lost;
      size_t tried = 0;
      for (const auto& [key, held] : due) {
        if (stop_requested_) break;
        ++tried;
        if (!tier_->RenewLease(key, held.lease_id, held.ttl).ok()) lost.emplace_back(key, held);
      }
      lock.Lock();
      stats_.renewals += tried - lost.size();
      for (const auto& [key, held] : lost) {
        auto it = held_.find(key);
        if (it == held_.end() || it->second.lease_id != held.lease_id) continue;  // forgotten meanwhile
        held_.erase(it);
        ++stats_.lost;
      }
      continue;
    }
    changed_.WaitUntil(&mu_, next);
  }
}

}  // namespace lazykv
