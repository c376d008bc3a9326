#include "cache_server/lease_table.h"

#include <random>

namespace lazykv::cache {

LeaseTable::LeaseTable(std::function<bool(const Hash128&)> is_stored, CacheMetrics* metrics)
    : is_stored_(std::move(is_stored)), metrics_(metrics) {
  std::random_device device;
  MutexLock lock(&mu_);
  // Random high bits, the low bit set: never 0 ("no lease"), and far from another run's ids.
  next_id_ = (static_cast<uint64_t>(device()) << 32 | 1) & ~(1ull << 63);
}

LeaseTable::Result LeaseTable::Acquire(const Hash128& key, const std::string& holder, std::chrono::milliseconds ttl,
                                       Clock::time_point wait_until) {
  MutexLock lock(&mu_);
  bool counted_wait = false;
  while (true) {
    if (shutting_down_) return {Outcome::kShuttingDown};
    if (is_stored_(key)) {
      leases_.erase(key);
      return {Outcome::kStored};
    }
    const auto now = Clock::now();
    auto it = leases_.find(key);
    if (it != leases_.end() && it->second.expiry <= now) {
      metrics_->lease_expiries->Increment();
      leases_.erase(it);
      it = leases_.end();
    }
    if (it == leases_.end()) {
      const uint64_t id = next_id_++;
      leases_[key] = Lease{id, holder, now + ttl};
      metrics_->lease_grants->Increment();
      return {Outcome::kGranted, id, ttl};
    }
    const auto remaining = std::chrono::duration_cast<std::chrono::milliseconds>(it->second.expiry - now);
    if (now >= wait_until) return {Outcome::kHeld, it->second.id, remaining};
    if (!counted_wait) {
      metrics_->lease_waits->Increment();
      counted_wait = true;
    }
    changed_.WaitUntil(&mu_, std::min(wait_until, it->second.expiry));
  }
}

void LeaseTable::Published(const Hash128& key) {
  {
    MutexLock lock(&mu_);
    leases_.erase(key);
  }
  changed_.SignalAll();
}

bool LeaseTable::HeldByAnother(const Hash128& key, uint64_t lease_id) const {
  MutexLock lock(&mu_);
  auto it = leases_.find(key);
  return it != leases_.end() && it->second.expiry > Clock::now() && it->second.id != lease_id;
}

bool LeaseTable::Release(const Hash128& key, uint64_t lease_id) {
  bool released = false;
  {
    MutexLock lock(&mu_);
    auto it = leases_.find(key);
    if (it != leases_.end() && it->second.id == lease_id) {
      leases_.erase(it);
      released = true;
    }
  }
  changed_.SignalAll();
  return released;
}

bool LeaseTable::Renew(const Hash128& key, uint64_t lease_id, std::chrono::milliseconds ttl) {
  MutexLock lock(&mu_);
  auto it = leases_.find(key);
  const Clock::time_point now = Clock::now();
  if (it == leases_.end() || it->second.id != lease_id || it->second.expiry <= now) return false;
  it->second.expiry = now + ttl;
  return true;
}

void LeaseTable::Shutdown() {
  {
    MutexLock lock(&mu_);
    shutting_down_ = true;
  }
  changed_.SignalAll();
}

size_t LeaseTable::active() const {
  MutexLock lock(&mu_);
  return leases_.size();
}

}  // namespace lazykv::cache
