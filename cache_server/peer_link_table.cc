#include "cache_server/peer_link_table.h"

#include <spdlog/spdlog.h>

#include <random>

#include "absl/strings/str_format.h"

namespace lazykv::cache {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

PeerLinkTable::PeerLinkTable(PeerLinkLimits limits, int device, bool emulated)
    : limits_(limits), device_(device), emulated_(emulated), random_(std::random_device{}()) {}

PeerLinkTable::~PeerLinkTable() {
  absl::flat_hash_map<uint64_t, Session> sessions;
  {
    MutexLock lock(&mu_);
    sessions.swap(sessions_);
  }
  for (auto& [id, session] : sessions) {
    if (session.link != nullptr) session.link->Abort();
  }
}

absl::Status PeerLinkTable::CanServe(std::string_view kind) const {
  if (kind == "nccl" && emulated_) {
    return absl::FailedPreconditionError("this server's GPU tier is emulated in host memory: no NCCL link");
  }
  if (kind == "socket" && !emulated_) {
    return absl::FailedPreconditionError("a socket link carries host memory only; this GPU tier is on a GPU");
  }
  return PeerLinkAvailable(kind);
}

absl::StatusOr<PeerLinkTable::Opened> PeerLinkTable::Open(std::string_view kind, const std::string& owner,
                                                          std::function<void()> cancel) {
  if (absl::Status can = CanServe(kind); !can.ok()) return can;
  uint64_t id = 0;
  {
    // The slot is taken before the id is made: making an NCCL id starts a rendezvous thread
    // that only the two ranks' joining ends, so a refused session must not make one.
    MutexLock lock(&mu_);
    if (shut_down_) return absl::UnavailableError("the cache server is shutting down");
    if (sessions_.size() >= limits_.max_sessions) {
      return absl::ResourceExhaustedError(
          absl::StrFormat("%d peer link sessions are open (--peer-max-sessions)", limits_.max_sessions));
    }
    // Random ids: one worker cannot guess another's (PeerGet checks the owner too).
    do {
      id = (random_() >> 1) | 1;
    } while (sessions_.contains(id));
    sessions_[id] = Session{std::string(kind), "", owner, std::move(cancel), nullptr};  // give_up: fresh
    ++totals_.sessions;
  }
  auto link_id = NewPeerLinkId(PeerLinkOptions{.kind = std::string(kind), .device = device_, .cancel = nullptr});
  if (!link_id.ok()) {
    Close(id);
    return link_id.status();
  }
  MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return absl::UnavailableError("the cache server is shutting down");
  it->second.link_id = *link_id;
  return Opened{id, *std::move(link_id)};
}

absl::Status PeerLinkTable::Join(uint64_t session_id) {
  PeerLinkOptions options{.kind = "", .device = device_, .cancel = nullptr};
  std::string link_id;
  {
    MutexLock lock(&mu_);
    auto it = sessions_.find(session_id);
    if (it == sessions_.end()) return absl::FailedPreconditionError("unknown peer link session");
    options.kind = it->second.kind;
    options.cancel = it->second.give_up;
    link_id = it->second.link_id;
  }
  // Without the lock: the worker may take up to join_timeout.
  auto link = ConnectPeerLink(options, link_id, /*rank=*/0, Clock::now() + limits_.join_timeout);
  if (!link.ok()) return link.status();
  MutexLock lock(&mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return absl::FailedPreconditionError("peer link session closed while joining");
  it->second.link = *std::move(link);
  joined_.SignalAll();
  return absl::OkStatus();
}

absl::Status PeerLinkTable::Send(uint64_t session_id, const std::string& caller, std::vector<std::string_view> pieces,
                                 std::shared_ptr<const void> hold) {
  std::shared_ptr<PeerLink> link;
  {
    MutexLock lock(&mu_);
    // The worker's side of the join can end before this side's has stored the link: a
    // PeerGet that comes then waits for it (a join that fails closes the session).
    const auto until = Clock::now() + limits_.join_timeout;
    auto it = sessions_.find(session_id);
    while (it != sessions_.end() && it->second.link == nullptr && Clock::now() < until) {
      joined_.WaitUntil(&mu_, until);
      it = sessions_.find(session_id);
    }
    if (it == sessions_.end() || it->second.owner != caller) {
      // Another caller's session is as unknown as a closed one: nothing about it is told.
      return absl::FailedPreconditionError(absl::StrFormat("unknown peer link session %016x", session_id));
    }
    link = it->second.link;
    if (link == nullptr || !link->alive()) return absl::FailedPreconditionError("the session's peer link is down");
    ++totals_.in_flight;
  }
  uint64_t bytes = 0;
  for (std::string_view piece : pieces) bytes += piece.size();
  // The callback holds the chunk's pages, never the link: the link's own thread runs it,
  // and must not be the one to destroy the link.
  link->Send(std::move(pieces), Clock::now() + limits_.send_timeout,
             [this, bytes, hold = std::move(hold)](absl::Status status) { Ended(bytes, status); });
  return absl::OkStatus();
}

void PeerLinkTable::Ended(uint64_t bytes, const absl::Status& status) {
  MutexLock lock(&mu_);
  --totals_.in_flight;
  if (status.ok()) {
    ++totals_.chunks_sent;
    totals_.bytes_sent += bytes;
  } else {
    ++totals_.failed;
    spdlog::warn("peer link transfer of {} bytes failed: {}", bytes, std::string(status.message()));
  }
}

void PeerLinkTable::Close(uint64_t session_id) {
  std::shared_ptr<PeerLink> link;
  {
    MutexLock lock(&mu_);
    auto it = sessions_.find(session_id);
    if (it == sessions_.end()) return;
    link = std::move(it->second.link);
    it->second.give_up->store(true);  // a join under way ends now
    sessions_.erase(it);
    --totals_.sessions;
    joined_.SignalAll();  // a PeerGet waiting for the join answers now
  }
  if (link != nullptr) link->Abort();  // ends what the worker will never receive now
}

void PeerLinkTable::Shutdown() {
  MutexLock lock(&mu_);
  shut_down_ = true;
  for (auto& [id, session] : sessions_) {
    session.give_up->store(true);
    if (session.cancel) session.cancel();
  }
}

PeerLinkTotals PeerLinkTable::totals() const {
  MutexLock lock(&mu_);
  return totals_;
}

}  // namespace lazykv::cache
