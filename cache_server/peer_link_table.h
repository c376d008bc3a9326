// The cache server's peer link sessions (DESIGN.md section 5): one point-to-point link
// (common/peer_link/) per worker session, from this server's GPU tier to the worker's GPU,
// for chunks that cross GPUs (NCCL) where CUDA IPC cannot reach. A session is one worker's
// PeerLinkSession stream: it opens the link, and when the stream ends the link is aborted,
// which ends any transfer still in flight (its pages' holds go with it).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <random>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "common/peer_link/peer_link.h"

namespace lazykv::cache {

struct PeerLinkLimits {
  uint32_t max_sessions = 32;  // links at once (each NCCL communicator takes device memory)
  // The worker must join the link this long after the server answers.
  std::chrono::milliseconds join_timeout{30000};
  // A queued transfer the worker has not received by then fails, and its link is aborted.
  std::chrono::milliseconds send_timeout{10000};
};

struct PeerLinkTotals {
  uint64_t sessions = 0;       // open now (joined or joining)
  uint64_t in_flight = 0;      // transfers queued or under way
  uint64_t chunks_sent = 0, bytes_sent = 0;
  uint64_t failed = 0;         // transfers that ended in an error
};

// Thread-safe. The links' own threads call back into it (transfer ends) without its lock.
class PeerLinkTable {
 public:
  // `device`: the GPU tier's CUDA device; `emulated`: the GPU tier lives in host memory, and
  // only "socket" links can carry its bytes (an "nccl" link needs device memory).
  PeerLinkTable(PeerLinkLimits limits, int device, bool emulated);
  ~PeerLinkTable();  // aborts every link

  const PeerLinkLimits& limits() const { return limits_; }
  // The one kind of link this server makes: "socket" for an emulated GPU tier, else "nccl".
  const char* kind() const { return emulated_ ? "socket" : "nccl"; }
  // OK when this server can open links of `kind`; FAILED_PRECONDITION saying why not.
  absl::Status CanServe(std::string_view kind) const;
  // Registers a session for `owner` and makes its link's id (to hand to the worker).
  // `cancel` ends the session's stream (Shutdown calls it). RESOURCE_EXHAUSTED past
  // max_sessions; UNAVAILABLE after Shutdown; FAILED_PRECONDITION as CanServe.
  struct Opened {
    uint64_t session_id;
    std::string link_id;
  };
  absl::StatusOr<Opened> Open(std::string_view kind, const std::string& owner, std::function<void()> cancel)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Joins the session's link as the sender; blocks until the worker joins or join_timeout.
  absl::Status Join(uint64_t session_id) ABSL_LOCKS_EXCLUDED(mu_);
  // Queues `pieces` (GPU tier memory) on the session of `caller` (its owner: another
  // caller's session is unknown to it); `hold` (the chunk's pages) is
  // kept until the transfer ends, so eviction cannot reuse them under it. Waits (up to the
  // join timeout) for a link still joining. FAILED_PRECONDITION when the session is
  // unknown or closed, or its link is dead.
  absl::Status Send(uint64_t session_id, const std::string& caller, std::vector<std::string_view> pieces,
                    std::shared_ptr<const void> hold) ABSL_LOCKS_EXCLUDED(mu_);
  // Aborts the session's link and forgets the session (its stream ended).
  void Close(uint64_t session_id) ABSL_LOCKS_EXCLUDED(mu_);
  // Ends every session's stream and refuses new ones (server shutdown).
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);
  PeerLinkTotals totals() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Session {
    std::string kind;
    std::string link_id;
    std::string owner;
    std::function<void()> cancel;
    std::shared_ptr<PeerLink> link;  // null until joined
    // Set by Close and Shutdown: a join under way gives up (the server's shutdown does not
    // wait out a worker that never joins).
    std::shared_ptr<std::atomic<bool>> give_up = std::make_shared<std::atomic<bool>>(false);
  };
  void Ended(uint64_t bytes, const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);

  const PeerLinkLimits limits_;
  const int device_;
  const bool emulated_;
  mutable Mutex mu_;
  absl::flat_hash_map<uint64_t, Session> sessions_ ABSL_GUARDED_BY(mu_);
  std::mt19937_64 random_ ABSL_GUARDED_BY(mu_);  // session ids
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  PeerLinkTotals totals_ ABSL_GUARDED_BY(mu_);
  CondVar joined_;  // a session's link joined, or a session closed
};

}  // namespace lazykv::cache
