// Single flight for chunk computation (DESIGN.md section 4): on a miss exactly one
// caller holds the lease and computes; the others wait to be woken by the publication
// or by the lease's expiry (a crashed holder blocks nobody for longer than its TTL),
// after which one waiter is granted the lease in turn.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>

#include "cache_server/cache_metrics.h"
#include "common/chunk_key.h"
#include "common/mutex.h"

namespace lazykv::cache {

// Thread-safe: every method may be called from any thread; Acquire blocks its caller
// (never the others) while it waits.
class LeaseTable {
 public:
  using Clock = std::chrono::steady_clock;

  enum class Outcome { kGranted, kStored, kHeld, kShuttingDown };
  struct Result {
    Outcome outcome = Outcome::kHeld;
    uint64_t lease_id = 0;
    std::chrono::milliseconds remaining{0};  // kGranted / kHeld: time left on the lease
  };

  // `is_stored` reports whether the chunk is stored; it is asked under the table's lock
  // so that a publication cannot slip between the check and a grant (so it must not call
  // back into the table). `metrics` outlives the table.
  LeaseTable(std::function<bool(const Hash128&)> is_stored, CacheMetrics* metrics);

  // Grants the lease, reports the chunk stored, or (when another caller holds it) waits
  // until `wait_until` for the publication or the lease's expiry. `owner` is the
  // authenticated caller (common/security/call_authorizer.h): only it may publish under,
  // renew or release the lease, so a lease id alone (which a HELD answer does not reveal:
  // its lease_id is 0) is no capability. `holder` is the caller's label, for logs.
  Result Acquire(const Hash128& key, const std::string& holder, const std::string& owner, std::chrono::milliseconds ttl,
                 Clock::time_point wait_until);
  // The chunk was stored: its lease (whoever holds it) ends and every waiter wakes.
  void Published(const Hash128& key);
  // Whether an unexpired lease on `key` is another's than (`lease_id`, `owner`): a Put must
  // then carry that lease from its owner (nobody else may publish under a leased key).
  bool HeldByAnother(const Hash128& key, uint64_t lease_id, const std::string& owner) const;
  // The holder gives up (it failed to compute): the next waiter is granted the lease.
  bool Release(const Hash128& key, uint64_t lease_id, const std::string& owner);
  // The holder is still computing: its unexpired lease now ends `ttl` from now. False when
  // (`lease_id`, `owner`) does not hold `key` (expired, released, published, another's).
  bool Renew(const Hash128& key, uint64_t lease_id, const std::string& owner, std::chrono::milliseconds ttl);
  // Wakes every waiter with kShuttingDown; later calls return it at once.
  void Shutdown();
  size_t active() const;

 private:
  struct Lease {
    uint64_t id = 0;
    std::string holder;
    std::string owner;
    Clock::time_point expiry;
  };
  // The lease on `key` if (`lease_id`, `owner`) holds it unexpired.
  Lease* FindHeld(const Hash128& key, uint64_t lease_id, const std::string& owner) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::function<bool(const Hash128&)> is_stored_;
  CacheMetrics* const metrics_;
  mutable Mutex mu_;
  CondVar changed_;  // a lease ended, or shutting_down_
  std::unordered_map<Hash128, Lease, Hash128Hasher> leases_ ABSL_GUARDED_BY(mu_);
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace lazykv::cache
