// Read leases of the same-host transport (DESIGN.md section 5): a worker that maps the
// host arena reads a chunk's pages in place, so the server must neither free nor reuse
// them while it reads. A read lease holds the chunk's HostValue (whose pages go back to
// the arena only when its last holder lets go: eviction and Delete drop the index entry,
// never the pages under a reader) until the worker releases it or its session ends. A
// session is one worker's ShmSession stream: when the stream ends (the worker closed
// it, exited, or was killed), every lease taken under it is dropped at once.
//
// A session also holds its reservations: host pages a worker publishing on the same host
// writes into before it commits them (a ChunkWriter, handed back to the store at commit;
// dropped, and its pages freed, when abandoned or when the session ends).
//
// A session ended while its worker's process lives on (frozen: stopped, or stuck in the
// kernel, past the connection's keepalive) is orphaned: its leases and reservations stay
// held, and counted against the bounds, until the process exits (a pidfd says so:
// process_watch.h) or `orphan_hold` passes, so a worker that resumes mid-copy reads and
// writes only pages that are still its own. A reaper thread drops them.
//
// Bounds, so that no worker can pin the arena: leases and reservations, and their bytes,
// per session, and their bytes over all sessions; past them Acquire and Reserve answer
// RESOURCE_EXHAUSTED (the worker then reads or publishes the chunk over gRPC).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "cache_server/cache_metrics.h"
#include "cache_server/host_arena.h"
#include "cache_server/process_watch.h"
#include "cache_server/tiered_store.h"
#include "common/chunk_key.h"
#include "common/mutex.h"

namespace lazykv::cache {

struct ShmLeaseLimits {
  uint32_t max_sessions = 64;
  uint32_t max_leases_per_session = 256;
  uint64_t max_bytes_per_session = 256ull << 20;
  uint64_t max_bytes_total = 512ull << 20;
  // The longest an orphaned session's leases and reservations are held for a process that
  // does not exit. A worker frozen longer than the keepalive plus this, and then resumed in
  // the middle of a copy, could read or write pages given to another chunk.
  std::chrono::seconds orphan_hold{600};
};

// Thread-safe: every method may be called from any thread (the sessions' handlers and
// the ShmGet handlers). HostValues are dropped outside the table's lock.
class ShmLeaseTable {
 public:
  // `metrics` (may be null) outlives the table; its shm gauges follow the table.
  ShmLeaseTable(ShmLeaseLimits limits, CacheMetrics* metrics);
  ~ShmLeaseTable();
  ShmLeaseTable(const ShmLeaseTable&) = delete;
  ShmLeaseTable& operator=(const ShmLeaseTable&) = delete;

  const ShmLeaseLimits& limits() const { return limits_; }

  // A new session of `owner` (the authenticated caller), under a fresh random id.
  // `cancel` ends the session's stream: Shutdown calls it under the table's lock, so it
  // must not call back into the table (ServerContext::TryCancel does not). `holder_pid`:
  // the worker's process (0: unknown, or one this host cannot see: nothing is held past the
  // session). RESOURCE_EXHAUSTED past max_sessions, UNAVAILABLE after Shutdown.
  absl::StatusOr<uint64_t> OpenSession(const std::string& owner, std::function<void()> cancel, int holder_pid = 0);
  // Ends the session: its leases and reservations are dropped, or, while its worker's
  // process lives, held as an orphan (above). No effect for an unknown id.
  void CloseSession(uint64_t session_id);

  // A read lease on `value` under the session: a fresh random id. FAILED_PRECONDITION when
  // the session is unknown or not `owner`'s; RESOURCE_EXHAUSTED past a bound.
  absl::StatusOr<uint64_t> Acquire(uint64_t session_id, const std::string& owner,
                                   std::shared_ptr<const HostValue> value) {
    const uint64_t bytes = value->size();
    return Acquire(session_id, owner, std::shared_ptr<const void>(std::move(value)), bytes);
  }
  // The same for any value that holds `bytes` in place while it lives (a GpuValue's pages
  // in device memory); the bounds count its bytes with the host leases'. With `share` < 1
  // the lease must fit within that share of every bound (what is held counts whole): a
  // lookup's speculative leases leave the rest of a session's room to its fetches.
  // REQUIRES: 0 < share <= 1.
  // A nonzero `lookup_id` files the lease under that lookup too (ReleaseLookup); the session
  // remembers its last kTrackedLookups lookups.
  absl::StatusOr<uint64_t> Acquire(uint64_t session_id, const std::string& owner, std::shared_ptr<const void> value,
                                   uint64_t bytes, double share = 1.0, uint64_t lookup_id = 0);
  // False when the session does not hold the lease (released already, or never).
  bool Release(uint64_t session_id, uint64_t lease_id);
  // Releases what the session still holds of the leases taken under `lookup_id` (a lookup
  // whose answer the worker lost), and refuses any it would take after; how many.
  int ReleaseLookup(uint64_t session_id, uint64_t lookup_id);
  static constexpr size_t kTrackedLookups = 4096;

  // Pages reserved for a same-host publication of `key` (under the worker's `lease_id`).
  struct Reservation {
    Hash128 key;
    Hash128 model_fingerprint;
    uint64_t lease_id = 0;
    std::unique_ptr<ChunkWriter> writer;
  };
  // Holds the reservation under the session: a fresh random id. Errors as Acquire's (the
  // refused writer is dropped, its pages freed).
  absl::StatusOr<uint64_t> Reserve(uint64_t session_id, const std::string& owner, Reservation reservation);
  // Hands the reservation back for its commit; FAILED_PRECONDITION when the session (of
  // `owner`) does not hold it.
  absl::StatusOr<Reservation> TakeReservation(uint64_t session_id, const std::string& owner, uint64_t reservation_id);
  // Drops the reservation (its pages go back); false when the session does not hold it.
  bool Abandon(uint64_t session_id, uint64_t reservation_id);

  // Refuses new sessions and cancels every session's stream (their handlers then close
  // them). From then on a closing session is never orphaned: the server is going away.
  void Shutdown();
  // Drops every session's and orphan's leases and reservations now (after Shutdown, before
  // the store whose pages they hold goes).
  void DropAll() ABSL_LOCKS_EXCLUDED(mu_);

  struct Totals {
    uint64_t sessions = 0;
    uint64_t leases = 0;
    uint64_t reservations = 0;
    uint64_t bytes = 0;  // of leases and reservations, orphans' included
    uint64_t orphaned_sessions = 0;
  };
  Totals totals() const;

 private:
  struct Session {
    std::string owner;
    std::function<void()> cancel;
    struct Held {
      std::shared_ptr<const void> value;  // a HostValue or a GpuValue: its pages stay while held
      uint64_t bytes = 0;
    };
    absl::flat_hash_map<uint64_t, Held> leases;
    absl::flat_hash_map<uint64_t, Reservation> reservations;
    // Leases by the lookup that took them, for the last kTrackedLookups lookups (oldest first).
    struct Lookup {
      std::vector<uint64_t> leases;
      bool released = false;  // its worker released it: no more leases under it
    };
    absl::flat_hash_map<uint64_t, Lookup> lookups;
    std::deque<uint64_t> lookup_order;
    uint64_t bytes = 0;                    // of both
    std::unique_ptr<ProcessWatch> holder;  // the worker's process, when known
    std::chrono::steady_clock::time_point orphaned_at;
  };
  // Drops orphans whose process has exited or whose hold has passed, every 50 ms while any
  // is held.
  void ReaperLoop() ABSL_LOCKS_EXCLUDED(mu_);
  // Keeps an ended session's leases and reservations as an orphan (its counts stay); returns
  // the caller's oldest orphan when it had too many (dropped: its counts taken off).
  Session OrphanLocked(Session session) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `lookup_id`'s entry in the session, made (and the oldest aged out) when new.
  static Session::Lookup* TrackLookupLocked(Session& session, uint64_t lookup_id);
  // Takes `session`'s counts off the totals (it is being dropped).
  void UncountLocked(const Session& session) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The session of `owner`, or FAILED_PRECONDITION.
  absl::StatusOr<Session*> FindLocked(uint64_t session_id, const std::string& owner) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // OK when `bytes` more fit `share` of the session's and the total bounds, and one more
  // entry `share` of its count.
  absl::Status CheckRoomLocked(const Session& session, uint64_t bytes, double share = 1.0) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdateGaugesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ShmLeaseLimits limits_;
  CacheMetrics* const metrics_;
  mutable Mutex mu_;
  absl::flat_hash_map<uint64_t, Session> sessions_ ABSL_GUARDED_BY(mu_);
  uint64_t leases_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t reservations_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<Session> orphans_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  CondVar orphaned_;  // orphans_ gained one, or stopping_
  std::thread reaper_;
};

}  // namespace lazykv::cache
