// Keeps this worker's leases alive while it computes their chunks (DESIGN.md section 5b).
// A lease is taken with a short TTL, bounded by what the chunk takes to compute, so a
// holder that crashes blocks nobody for long; while the holder works, this renews each
// lease at a third of its TTL until the chunk is published or given up (Forget). A
// renewal the tier refuses (the lease expired or was taken) drops the lease: the
// publication then goes without it, and the tier decides.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <unordered_map>

#include "common/chunk_key.h"
#include "common/mutex.h"
#include "worker/tier/chunk_tier.h"

namespace lazykv {

struct LeaseKeeperStats {
  uint64_t renewals = 0;   // renewals the tier accepted
  uint64_t lost = 0;       // leases the tier no longer held when renewed
  uint64_t abandoned = 0;  // leases held past max_hold (the chunk never published nor released)
};

// Thread-safe; one thread of its own renews. The destructor stops it (leases then lapse).
class LeaseKeeper {
 public:
  // `tier` outlives the keeper. A lease is renewed for at most `max_hold` in all.
  LeaseKeeper(ChunkTier* tier, std::chrono::milliseconds max_hold);
  ~LeaseKeeper();
  LeaseKeeper(const LeaseKeeper&) = delete;
  LeaseKeeper& operator=(const LeaseKeeper&) = delete;

  // Starts renewing `lease_id` on `key`, granted now with `ttl`.
  void Keep(const Hash128& key, uint64_t lease_id, std::chrono::milliseconds ttl) ABSL_LOCKS_EXCLUDED(mu_);
  // Stops renewing it (published, released, or given up). No effect for another lease.
  void Forget(const Hash128& key, uint64_t lease_id) ABSL_LOCKS_EXCLUDED(mu_);

  size_t held() const ABSL_LOCKS_EXCLUDED(mu_);
  LeaseKeeperStats stats() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  using Clock = std::chrono::steady_clock;
  struct Held {
    uint64_t lease_id = 0;
    std::chrono::milliseconds ttl{0};
    Clock::time_point next_renewal;
    Clock::time_point give_up;
  };
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  ChunkTier* const tier_;
  const std::chrono::milliseconds max_hold_;
  mutable Mutex mu_;
  CondVar changed_;  // a lease was added, or stopping_
  std::unordered_map<Hash128, Held, Hash128Hasher> held_ ABSL_GUARDED_BY(mu_);
  LeaseKeeperStats stats_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<bool> stop_requested_{false};  // read between renewals, without the lock
  std::thread thread_;  // last: started after the members above
};

}  // namespace lazykv
