// The cache servers as one tier: the owner of a key among N servers by rendezvous
// hashing, lookups batched per owner. Built to fail fast on a sick server (DESIGN.md
// section 4): every call's deadline comes from what this worker has observed of that
// server (server_estimator.h: tens of milliseconds for a lookup or lease, more for a
// transfer by its size), the request path retries at most once and only on UNAVAILABLE
// or ABORTED, and a server that misses a deadline or stays UNAVAILABLE is marked down at
// once: its keys are misses (the worker computes them) with no network call until a
// background prober finds it answering health checks again. RESOURCE_EXHAUSTED (a busy
// or full server, or a chunk too large for it) is a miss for that call only.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "common/security/transport_security.h"
#include "proto/grpc/health/v1/health.grpc.pb.h"
#include "proto/kvcache.grpc.pb.h"
#include "worker/tier/chunk_tier.h"
#include "worker/tier/fetch_transport.h"
#include "worker/tier/peer_link_session.h"
#include "worker/tier/server_estimator.h"
#include "worker/tier/shm_session.h"

namespace lazykv {

struct RemoteTierOptions {
  std::vector<std::string> servers;  // HOST:PORT each
  std::string holder;                // this worker's name, in lease logs
  ClientSecurityOptions security;    // TLS, client certificate and token for every server
  // Ceilings: a small call's deadline (lookup, lease before its wait, release, probe) and
  // a transfer's. The deadlines themselves come from observed latency and throughput.
  std::chrono::milliseconds lookup_deadline{2000};
  std::chrono::milliseconds transfer_deadline{60000};
  std::chrono::milliseconds initial_call_deadline{100};  // a small call before any sample
  std::chrono::milliseconds min_call_deadline{20};       // floor of a small call's deadline
  int max_retries = 1;                                   // per call, on UNAVAILABLE or ABORTED only
  std::chrono::milliseconds retry_delay{10};
  std::chrono::milliseconds probe_interval{150};  // between health checks of a down server
  uint32_t slice_bytes = 4 << 20;
  FetchTransport transport = FetchTransport::kAuto;
  // After a server's same-host session could not be opened (or ended), the next attempt
  // waits this long; its fetches go over gRPC meanwhile (auto).
  std::chrono::milliseconds shm_retry_interval{5000};
  // Page-locks each server's mapped arena for the device copies (worker/setup sets the
  // CUDA backend's); empty: pageable.
  HostPinner shm_pinner;
  // This worker's CUDA device: a same-host server's GPU tier on it (or on a GPU it has peer
  // access to) is opened through CUDA IPC and its chunks fetched device to device, their
  // payloads never on the host. -1 (default): never; the setup leaves it so on the CPU and
  // when the fleet signs chunks (the MAC is checked on the host).
  int gpu_device = -1;
  // Links across GPUs (peer_link_session.h): their kind ("nccl"; "socket", its host-memory
  // twin, for tests against an emulated GPU tier), the receive buffers' bound, and how long
  // the answer to a session's opening may take.
  std::string peer_link_kind = "nccl";
  // Links per server: a fetch holds its link from PeerGet to the last byte, so several let
  // one chunk's round trip overlap another's transfer.
  int peer_links_per_server = 4;
  uint64_t peer_staging_bytes = 1ull << 30;
  uint64_t peer_first_buffer_bytes = 64ull << 20;  // a link's first receive buffer (grows to fit)
  std::chrono::milliseconds peer_answer_timeout{5000};
  // A lookup on a same-host session has the server lease what it finds in host RAM or the
  // GPU tier (LookupRequest.shm_session_id), so that fetching it is no further call; a
  // lease no fetch took by then is released. Zero: lookups lease nothing.
  std::chrono::milliseconds lookup_lease_hold{2000};
};

// "host:1,host:2" → servers; INVALID_ARGUMENT naming the bad entry.
absl::StatusOr<std::vector<std::string>> ParseServerList(std::string_view list);

// What the tier currently believes of one server (for status pages and logs).
struct ServerEstimate {
  std::string address;
  bool up = true;
  double latency_ms = 0;             // smoothed round trip of small calls; 0: no sample yet
  double bandwidth_bytes_per_s = 0;  // smoothed transfer throughput; 0: no sample yet
};

// Thread-safe, as every ChunkTier: gRPC stubs are, and each server's state is behind
// its own mutex. One thread of its own probes down servers; the destructor stops it.
class RemoteChunkTier final : public ChunkTier {
 public:
  static absl::StatusOr<std::unique_ptr<RemoteChunkTier>> Create(RemoteTierOptions options);
  ~RemoteChunkTier() override;

  std::vector<std::optional<TierHit>> Lookup(std::span<const Hash128> keys) override;
  absl::StatusOr<FetchedChunk> Fetch(const Hash128& key) override;
  void NotFetching(const Hash128& key) override;
  LeaseAnswer Lease(const Hash128& key, std::chrono::milliseconds ttl, std::chrono::milliseconds wait) override;
  void ReleaseLease(const Hash128& key, uint64_t lease_id) override;
  absl::Status RenewLease(const Hash128& key, uint64_t lease_id, std::chrono::milliseconds ttl) override;
  void ReportInvalid(const Hash128& key, std::string_view header, std::string_view reason) override;
  absl::Status Publish(const Hash128& key, const Hash128& model_fingerprint, std::string_view stored,
                       uint64_t lease_id) override;
  // To a server on the same host: pages of its arena reserved for the chunk, written in
  // place and committed (ShmReserve, ShmCommit); otherwise (or when it refuses, in auto) a
  // buffer sent by Publish at Commit.
  absl::StatusOr<std::unique_ptr<PublishSlot>> BeginPublish(const Hash128& key, const Hash128& model_fingerprint,
                                                            uint64_t stored_bytes, uint64_t lease_id) override;
  std::string Describe() const override;

  // Index of the server owning `key` (in options().servers).
  size_t OwnerOf(const Hash128& key) const;
  // One entry per server, in options().servers order.
  std::vector<ServerEstimate> Estimates() const;
  TransportStats transport_stats() const override;

 private:
  struct Server {
    explicit Server(DeadlinePolicy policy) : estimator(policy) {}
    std::string address;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<v1::KvCache::Stub> stub;
    std::unique_ptr<grpc::health::v1::Health::Stub> health;
    std::atomic<bool> refusal_logged{false};  // this worker's credentials were refused (logged once)
    mutable Mutex mu;
    bool up ABSL_GUARDED_BY(mu) = true;
    ServerEstimator estimator ABSL_GUARDED_BY(mu);
    // Calls under way (Run's), cancelled when the server goes down: a lease wait or a
    // transfer to a hung server ends then, not at its own deadline.
    std::set<grpc::ClientContext*> in_flight ABSL_GUARDED_BY(mu);
    // The same-host session, opened on first use (its opening holds shm_mu).
    Mutex shm_mu;
    std::shared_ptr<ShmClientSession> shm ABSL_GUARDED_BY(shm_mu);
    std::chrono::steady_clock::time_point shm_next_try ABSL_GUARDED_BY(shm_mu);
    bool shm_logged ABSL_GUARDED_BY(shm_mu) = false;  // the first refusal was logged
    // The links across GPUs (peer_links_per_server), opened in the background on first use.
    struct PeerSlot {
      std::shared_ptr<PeerLinkClientSession> session;
      std::chrono::steady_clock::time_point next_try;
    };
    Mutex peer_mu;
    std::vector<PeerSlot> peers ABSL_GUARDED_BY(peer_mu);
    bool peer_logged ABSL_GUARDED_BY(peer_mu) = false;  // an opening's failure or an end was logged
    // Chunks a lookup leased ahead for their fetches (remote_chunk_tier_shm.cc), adopted:
    // pieces of the session's mappings that release their lease when dropped.
    struct LookedUp {
      ChunkBytes bytes;  // on the device from the GPU tier, else in the session's host mapping
      std::shared_ptr<ShmClientSession> session;
      std::chrono::steady_clock::time_point leased_at;
    };
    Mutex looked_up_mu;
    std::unordered_map<Hash128, std::vector<LookedUp>, Hash128Hasher> looked_up ABSL_GUARDED_BY(looked_up_mu);
  };
  // A call's outcome: its status, and how long the answered try took.
  struct Attempted {
    grpc::Status status;
    std::chrono::nanoseconds elapsed{0};
  };
  explicit RemoteChunkTier(RemoteTierOptions options);
  static bool Up(Server& server) ABSL_LOCKS_EXCLUDED(server.mu);
  std::chrono::microseconds CallDeadline(Server& server) ABSL_LOCKS_EXCLUDED(server.mu);
  std::chrono::microseconds TransferDeadline(Server& server, uint64_t bytes) ABSL_LOCKS_EXCLUDED(server.mu);
  // Logs the transition once, cancels the calls under way and wakes the prober.
  void MarkDown(Server& server, const grpc::Status& status, std::string_view call) ABSL_LOCKS_EXCLUDED(server.mu);
  // Runs `call` (a fresh context each try) under `deadline`, retrying up to `retries`
  // times on UNAVAILABLE or ABORTED; marks the server down on DEADLINE_EXCEEDED or a
  // last UNAVAILABLE. UNAVAILABLE without a call when the server is already down.
  template <typename Call>
  Attempted Run(Server& server, std::chrono::microseconds deadline, int retries, std::string_view name, Call call);
  // The server's same-host session, opened now if none is and an attempt is due; null
  // when there is none.
  std::shared_ptr<ShmClientSession> ShmSessionFor(Server& server) ABSL_LOCKS_EXCLUDED(server.shm_mu);
  // The server's same-host session as it is (null: none), never opened here.
  static std::shared_ptr<ShmClientSession> CurrentShmSession(Server& server) ABSL_LOCKS_EXCLUDED(server.shm_mu);
  // A fetch over the same-host session: NOT_FOUND (a miss), or any other error (then gRPC
  // in auto mode).
  absl::StatusOr<FetchedChunk> FetchShm(Server& server, const Hash128& key);
  // A lookup's leases (remote_chunk_tier_shm.cc): the session to lease under, when the
  // server is on this host and lookups lease (null otherwise); the answer's lease adopted
  // and kept for `key`'s fetch; a kept one taken (nullopt: none usable); kept ones dropped
  // (their leases released): one or all of `key`'s, or every one no longer usable (held past
  // their time, or of a session that ended or was replaced).
  std::shared_ptr<ShmClientSession> LookupLeaseSession(Server& server);
  // A same-host fetch's answer: counted by transport (cuda_ipc when on the device), its
  // payload taken as verified.
  FetchedChunk SameHostFetched(Server& server, ChunkBytes bytes, double setup_seconds);
  void KeepLookupLease(Server& server, const Hash128& key, const v1::ShmGetResponse& lease,
                       std::shared_ptr<ShmClientSession> session);
  std::optional<FetchedChunk> TakeLookupLease(Server& server, const Hash128& key);
  void DropLookupLeases(Server& server, const Hash128& key, bool all);
  void DropUnusableLookupLeases(Server& server);
  absl::StatusOr<FetchedChunk> FetchGrpc(Server& server, const Hash128& key);
  // Whether a chunk in the server's GPU tier should come over a peer link (remote_chunk_tier_peer.cc).
  bool WantsPeerLink(Server& server);
  // The least busy of the server's ready peer link sessions; starts opening those not open
  // whose attempt is due (null while none is ready).
  std::shared_ptr<PeerLinkClientSession> PeerSessionFor(Server& server) ABSL_LOCKS_EXCLUDED(server.peer_mu);
  // A fetch over the peer link: NOT_FOUND when the server's GPU tier does not hold it,
  // FAILED_PRECONDITION with no session ready; either way another transport may serve it.
  absl::StatusOr<FetchedChunk> FetchPeer(Server& server, const Hash128& key);
  class ShmPublishSlot;
  // ShmCommit of a reservation (the slot's Commit).
  absl::Status CommitShm(Server& server, ShmClientSession& session, uint64_t reservation_id, uint64_t bytes);
  bool AnyDown() const;
  void ProberLoop() ABSL_LOCKS_EXCLUDED(prober_mu_);
  void Probe(Server& server) ABSL_LOCKS_EXCLUDED(prober_mu_);  // one health check; up when it answers

  const RemoteTierOptions options_;
  std::vector<std::unique_ptr<Server>> servers_;
  Mutex prober_mu_;      // taken before any Server::mu, never while holding one
  CondVar prober_wake_;  // a server went down, or stopping_
  bool stopping_ ABSL_GUARDED_BY(prober_mu_) = false;
  grpc::ClientContext* probe_ ABSL_GUARDED_BY(prober_mu_) = nullptr;  // the health check under way
  std::thread prober_;
  std::atomic<uint64_t> grpc_chunks_{0}, grpc_bytes_{0}, shm_chunks_{0}, shm_bytes_{0}, shm_fallbacks_{0};
  std::atomic<uint64_t> cuda_ipc_chunks_{0}, cuda_ipc_bytes_{0};
  std::atomic<uint64_t> lookup_leases_used_{0}, lookup_leases_unused_{0};
  std::atomic<uint64_t> lookups_{0};  // numbers each lookup's id (NextLookupId)
  uint64_t NextLookupId();
  std::atomic<uint64_t> nccl_chunks_{0}, nccl_bytes_{0};
  std::shared_ptr<StagingPool> peer_staging_;  // receive buffers of peer link fetches
  std::atomic<uint64_t> shm_published_chunks_{0}, shm_published_bytes_{0};
};

}  // namespace lazykv
