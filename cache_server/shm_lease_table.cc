#include "cache_server/shm_lease_table.h"

#include <openssl/rand.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <random>

#include "absl/strings/str_format.h"

namespace lazykv::cache {
namespace {

constexpr size_t kMaxOrphansPerOwner = 4;

// A fresh random id, never 0: a lease or session id from another worker, or from before
// a restart, matches nothing.
uint64_t RandomId() {
  uint64_t id = 0;
  while (id == 0) {
    if (RAND_bytes(reinterpret_cast<unsigned char*>(&id), sizeof(id)) != 1) id = std::random_device()() | 1;
  }
  return id;
}

}  // namespace

ShmLeaseTable::ShmLeaseTable(ShmLeaseLimits limits, CacheMetrics* metrics) : limits_(limits), metrics_(metrics) {
  reaper_ = std::thread([this] { ReaperLoop(); });
}

ShmLeaseTable::~ShmLeaseTable() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    orphaned_.SignalAll();
  }
  reaper_.join();
  DropAll();
}

void ShmLeaseTable::ReaperLoop() {
  MutexLock lock(&mu_);
  while (!stopping_) {
    if (orphans_.empty()) {
      orphaned_.Wait(&mu_);
      continue;
    }
    orphaned_.WaitUntil(&mu_, std::chrono::steady_clock::now() + std::chrono::milliseconds(50));
    const auto now = std::chrono::steady_clock::now();
    std::vector<Session> done;
    for (size_t i = 0; i < orphans_.size();) {
      Session& orphan = orphans_[i];
      const bool exited = !orphan.holder->Alive();
      if (exited || now - orphan.orphaned_at >= limits_.orphan_hold) {
        if (!exited) {
          spdlog::warn(
              "shm: the orphaned session of {} (pid {}) held its pages {} s; dropping them (the process "
              "lives: a worker that resumes in a copy now could see another chunk's pages)",
              orphan.owner, orphan.holder->pid(), limits_.orphan_hold.count());
        }
        UncountLocked(orphan);
        done.push_back(std::move(orphan));
        orphans_.erase(orphans_.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
    if (done.empty()) continue;
    UpdateGaugesLocked();
    lock.Unlock();
    done.clear();  // pages go back to the arena outside the lock
    lock.Lock();
  }
}

void ShmLeaseTable::UncountLocked(const Session& session) {
  leases_ -= session.leases.size();
  reservations_ -= session.reservations.size();
  bytes_ -= session.bytes;
}

absl::StatusOr<uint64_t> ShmLeaseTable::OpenSession(const std::string& owner, std::function<void()> cancel,
                                                    int holder_pid) {
  std::unique_ptr<ProcessWatch> holder;
  // Only a process of this server's user, not the server itself, can hold pages past its
  // session (another pid would let a worker pin them for the whole hold).
  struct stat proc {};
  const bool plausible = holder_pid > 0 && holder_pid != getpid() &&
                         stat(absl::StrFormat("/proc/%d", holder_pid).c_str(), &proc) == 0 && proc.st_uid == geteuid();
  if (holder_pid > 0 && !plausible) {
    spdlog::warn("shm session of {}: pid {} is not a process of this server's user; nothing is held past the session",
                 owner, holder_pid);
  }
  if (plausible) {
    auto watch = ProcessWatch::Open(holder_pid);
    if (watch.ok()) {
      holder = *std::move(watch);
    } else {
      spdlog::info("shm session of {}: cannot watch pid {} ({}); its pages are held until its stream ends", owner,
                   holder_pid, watch.status().ToString());
    }
  }
  MutexLock lock(&mu_);
  if (shut_down_) return absl::UnavailableError("cache server is shutting down");
  if (sessions_.size() >= limits_.max_sessions) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("server is at max_shm_sessions=%d; use Get", limits_.max_sessions));
  }
  uint64_t id = RandomId();
  while (sessions_.contains(id)) id = RandomId();
  Session& session = sessions_[id];
  session.owner = owner;
  session.cancel = std::move(cancel);
  session.holder = std::move(holder);
  UpdateGaugesLocked();
  return id;
}

void ShmLeaseTable::CloseSession(uint64_t session_id) {
  Session closed;          // its values and writers are dropped after the lock
  Session dropped_orphan;  // likewise
  {
    MutexLock lock(&mu_);
    auto it = sessions_.find(session_id);
    if (it == sessions_.end()) return;
    closed = std::move(it->second);
    sessions_.erase(it);
    const bool holds = !closed.leases.empty() || !closed.reservations.empty();
    if (holds && !shut_down_ && closed.holder != nullptr && closed.holder->Alive()) {
      spdlog::warn(
          "shm session {:016x} of {} ended while its process (pid {}) lives: its {} leases and {} "
          "reservations stay held until it exits (at most {} s)",
          session_id, closed.owner, closed.holder->pid(), closed.leases.size(), closed.reservations.size(),
          limits_.orphan_hold.count());
      dropped_orphan = OrphanLocked(std::move(closed));
    } else {
      UncountLocked(closed);
    }
    UpdateGaugesLocked();
  }
}

ShmLeaseTable::Session ShmLeaseTable::OrphanLocked(Session session) {
  session.cancel = nullptr;  // its stream's context goes away now
  session.orphaned_at = std::chrono::steady_clock::now();
  // At most kMaxOrphansPerOwner per caller: a worker whose sessions keep ending while it
  // lives loses its oldest hold rather than pinning ever more.
  Session dropped;
  const auto owned = [&](const Session& s) { return s.owner == session.owner; };
  if (std::count_if(orphans_.begin(), orphans_.end(), owned) >= static_cast<std::ptrdiff_t>(kMaxOrphansPerOwner)) {
    const auto oldest = std::find_if(orphans_.begin(), orphans_.end(), owned);
    UncountLocked(*oldest);
    dropped = std::move(*oldest);
    orphans_.erase(oldest);
  }
  orphans_.push_back(std::move(session));
  orphaned_.SignalAll();
  return dropped;
}

absl::StatusOr<ShmLeaseTable::Session*> ShmLeaseTable::FindLocked(uint64_t session_id, const std::string& owner) {
  auto it = sessions_.find(session_id);
  if (it == sessions_.end() || it->second.owner != owner) {
    return absl::FailedPreconditionError(
        // Workers match "no shm session" to tell this from a chunk not in host RAM.
        absl::StrFormat("no shm session %016x of this caller (ended, or the server restarted)", session_id));
  }
  return &it->second;
}

absl::Status ShmLeaseTable::CheckRoomLocked(const Session& session, uint64_t size, double share) const {
  const auto bound = [share](uint64_t limit) { return static_cast<uint64_t>(static_cast<double>(limit) * share); };
  const std::string of_it = share < 1.0 ? absl::StrFormat(" (a lookup may take %g of it)", share) : "";
  const size_t held = session.leases.size() + session.reservations.size();
  if (held >= bound(limits_.max_leases_per_session)) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "shm session holds %d leases and reservations, at max_shm_leases_per_session=%d%s; release some or use gRPC",
        held, limits_.max_leases_per_session, of_it));
  }
  if (session.bytes + size > bound(limits_.max_bytes_per_session)) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("shm session holds %d bytes; %d more exceed max_shm_lease_bytes_per_session=%d%s; use gRPC",
                        session.bytes, size, limits_.max_bytes_per_session, of_it));
  }
  if (bytes_ + size > bound(limits_.max_bytes_total)) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("shm sessions hold %d bytes; %d more exceed max_shm_lease_bytes=%d%s; use gRPC", bytes_, size,
                        limits_.max_bytes_total, of_it));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> ShmLeaseTable::Acquire(uint64_t session_id, const std::string& owner,
                                                std::shared_ptr<const void> value, uint64_t size, double share,
                                                uint64_t lookup_id) {
  MutexLock lock(&mu_);
  absl::StatusOr<Session*> found = FindLocked(session_id, owner);
  if (!found.ok()) return found.status();
  Session& session = **found;
  if (absl::Status room = CheckRoomLocked(session, size, share); !room.ok()) return room;
  if (lookup_id != 0) {
    auto lookup = session.lookups.find(lookup_id);
    if (lookup != session.lookups.end() && lookup->second.released) {
      // Its worker gave it up before this lease was taken (a release that overtook it).
      return absl::FailedPreconditionError("the lookup was released by its worker");
    }
  }
  uint64_t id = RandomId();
  while (session.leases.contains(id) || session.reservations.contains(id)) id = RandomId();
  session.leases.emplace(id, Session::Held{std::move(value), size});
  session.bytes += size;
  ++leases_;
  if (lookup_id != 0) TrackLookupLocked(session, lookup_id)->leases.push_back(id);
  bytes_ += size;
  UpdateGaugesLocked();
  return id;
}

absl::StatusOr<uint64_t> ShmLeaseTable::Reserve(uint64_t session_id, const std::string& owner,
                                                Reservation reservation) {
  const uint64_t size = reservation.writer->size();
  MutexLock lock(&mu_);
  absl::StatusOr<Session*> found = FindLocked(session_id, owner);
  if (!found.ok()) return found.status();
  Session& session = **found;
  if (absl::Status room = CheckRoomLocked(session, size); !room.ok()) {
    lock.Unlock();  // the refused writer's pages go back outside the lock
    return room;
  }
  uint64_t id = RandomId();
  while (session.leases.contains(id) || session.reservations.contains(id)) id = RandomId();
  session.reservations.emplace(id, std::move(reservation));
  session.bytes += size;
  ++reservations_;
  bytes_ += size;
  UpdateGaugesLocked();
  return id;
}

absl::StatusOr<ShmLeaseTable::Reservation> ShmLeaseTable::TakeReservation(uint64_t session_id, const std::string& owner,
                                                                          uint64_t reservation_id) {
  MutexLock lock(&mu_);
  absl::StatusOr<Session*> found = FindLocked(session_id, owner);
  if (!found.ok()) return found.status();
  Session& session = **found;
  auto it = session.reservations.find(reservation_id);
  if (it == session.reservations.end()) {
    return absl::FailedPreconditionError(
        absl::StrFormat("shm session holds no reservation %016x (committed or abandoned)", reservation_id));
  }
  Reservation taken = std::move(it->second);
  session.reservations.erase(it);
  session.bytes -= taken.writer->size();
  --reservations_;
  bytes_ -= taken.writer->size();
  UpdateGaugesLocked();
  return taken;
}

bool ShmLeaseTable::Abandon(uint64_t session_id, uint64_t reservation_id) {
  Reservation dropped;  // its pages go back after the lock
  MutexLock lock(&mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return false;
  Session& session = it->second;
  auto r = session.reservations.find(reservation_id);
  if (r == session.reservations.end()) return false;
  dropped = std::move(r->second);
  session.reservations.erase(r);
  session.bytes -= dropped.writer->size();
  --reservations_;
  bytes_ -= dropped.writer->size();
  UpdateGaugesLocked();
  return true;
}

bool ShmLeaseTable::Release(uint64_t session_id, uint64_t lease_id) {
  std::shared_ptr<const void> released;  // dropped after the lock
  MutexLock lock(&mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return false;
  Session& session = it->second;
  auto lease = session.leases.find(lease_id);
  if (lease == session.leases.end()) return false;
  const uint64_t size = lease->second.bytes;
  released = std::move(lease->second.value);
  session.leases.erase(lease);
  session.bytes -= size;
  --leases_;
  bytes_ -= size;
  UpdateGaugesLocked();
  return true;
}

ShmLeaseTable::Session::Lookup* ShmLeaseTable::TrackLookupLocked(Session& session, uint64_t lookup_id) {
  auto [it, fresh] = session.lookups.try_emplace(lookup_id);
  if (fresh) {
    session.lookup_order.push_back(lookup_id);
    if (session.lookup_order.size() > kTrackedLookups) {
      session.lookups.erase(session.lookup_order.front());
      session.lookup_order.pop_front();
    }
  }
  return &session.lookups.find(lookup_id)->second;
}

int ShmLeaseTable::ReleaseLookup(uint64_t session_id, uint64_t lookup_id) {
  std::vector<std::shared_ptr<const void>> released;  // dropped after the lock
  MutexLock lock(&mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end() || lookup_id == 0) return 0;
  Session& session = it->second;
  // Kept as released (until it ages out), so that a lease the lookup takes after this
  // release overtook it is refused.
  Session::Lookup* lookup = TrackLookupLocked(session, lookup_id);
  lookup->released = true;
  for (uint64_t lease_id : lookup->leases) {
    auto lease = session.leases.find(lease_id);
    if (lease == session.leases.end()) continue;  // released one by one already
    session.bytes -= lease->second.bytes;
    bytes_ -= lease->second.bytes;
    --leases_;
    released.push_back(std::move(lease->second.value));
    session.leases.erase(lease);
  }
  lookup->leases.clear();
  UpdateGaugesLocked();
  return static_cast<int>(released.size());
}

// Under the lock: a session's handler closes it (taking the lock) before its stream's
// context goes away, so every cancel runs on a live context.
void ShmLeaseTable::Shutdown() {
  MutexLock lock(&mu_);
  shut_down_ = true;
  for (auto& [id, session] : sessions_) {
    if (session.cancel) session.cancel();
  }
}

void ShmLeaseTable::DropAll() {
  absl::flat_hash_map<uint64_t, Session> sessions;
  std::vector<Session> orphans;
  {
    MutexLock lock(&mu_);
    sessions.swap(sessions_);
    orphans.swap(orphans_);
    leases_ = reservations_ = bytes_ = 0;
    UpdateGaugesLocked();
  }  // values and writers are dropped after the lock
}

ShmLeaseTable::Totals ShmLeaseTable::totals() const {
  MutexLock lock(&mu_);
  return Totals{sessions_.size(), leases_, reservations_, bytes_, orphans_.size()};
}

void ShmLeaseTable::UpdateGaugesLocked() {
  if (metrics_ == nullptr) return;
  metrics_->shm_sessions->Set(static_cast<double>(sessions_.size()));
  metrics_->shm_leases->Set(static_cast<double>(leases_));
  metrics_->shm_leased_bytes->Set(static_cast<double>(bytes_));
  metrics_->shm_orphaned_sessions->Set(static_cast<double>(orphans_.size()));
}

}  // namespace lazykv::cache
