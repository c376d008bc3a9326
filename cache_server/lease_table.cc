#include "cache_server/lease_table.h"

#include <openssl/rand.h>

#include <random>

namespace lazykv::cache {

namespace {

// A fresh random id, never 0 ("no lease"): ids cannot be guessed from one another, nor
// match an id from before a restart.
uint64_t RandomLeaseId() {
  uint64_t id = 0;
  while (id == 0) {
    if (RAND_bytes(reinterpret_cast<unsigned char*>(&id), sizeof(id)) != 1) id = std::random_device()() | 1;
  }
  return id;
}

}  // namespace

LeaseTable::LeaseTable(std::function<bool(const Hash128&)> is_stored, CacheMetrics* metrics)
    : is_stored_(std::move(is_stored)), metrics_(metrics) {}

LeaseTable::Result LeaseTable::Acquire(const Hash128& key, const std::string& holder, const std::string& owner,
                                       std::chrono::milliseconds ttl, Clock::time_point wait_until) {
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
      const uint64_t id = RandomLeaseId();
      leases_[key] = Lease{id, holder, owner, now + ttl};
      metrics_->lease_grants->Increment();
      return {Outcome::kGranted, id, ttl};
    }
    const auto remaining = std::chrono::duration_cast<std::chrono::milliseconds>(it->second.expiry - now);
    if (now >= wait_until) return {Outcome::kHeld, 0, remaining};  // the holder's id stays its own
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

LeaseTable::Lease* LeaseTable::FindHeld(const Hash128& key, uint64_t lease_id, const std::string& owner) {
  auto it = leases_.find(key);
  if (it == leases_.end() || it->second.id != lease_id || it->second.owner != owner) return nullptr;
  return it->second.expiry > Clock::now() ? &it->second : nullptr;
}

bool LeaseTable::HeldByAnother(const Hash128& key, uint64_t lease_id, const std::string& owner) const {
  MutexLock lock(&mu_);
  auto it = leases_.find(key);
  if (it == leases_.end() || it->second.expiry <= Clock::now()) return false;
  return it->second.id != lease_id || it->second.owner != owner;
}

bool LeaseTable::Release(const Hash128& key, uint64_t lease_id, const std::string& owner) {
  bool released = false;
  {
    MutexLock lock(&mu_);
    if (FindHeld(key, lease_id, owner) != nullptr) {
      leases_.erase(key);
      released = true;
    }
  }
  changed_.SignalAll();
  return released;
}

bool LeaseTable::Renew(const Hash128& key, uint64_t lease_id, const std::string& owner, std::chrono::milliseconds ttl) {
  MutexLock lock(&mu_);
  Lease* lease = FindHeld(key, lease_id, owner);
  if (lease == nullptr) return false;
  lease->expiry = Clock::now() + ttl;
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
