// The KvCache gRPC service (proto/kvcache.proto) over a TieredStore and a LeaseTable.
// Limits: chunk size, lookup batch size, concurrent streams (and lease waits), lease
// TTL and wait; a call past a limit gets RESOURCE_EXHAUSTED or INVALID_ARGUMENT naming
// it, and the server goes on serving the others.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

#include "absl/container/flat_hash_map.h"
#include "cache_server/gpu_tier.h"
#include "cache_server/lease_table.h"
#include "cache_server/peer_link_table.h"
#include "cache_server/shm_lease_table.h"
#include "cache_server/stream_watchdog.h"
#include "cache_server/tiered_store.h"
#include "common/chunk_mac.h"
#include "common/chunk_wire.h"
#include "common/mutex.h"
#include "common/security/call_authorizer.h"
#include "proto/kvcache.grpc.pb.h"

namespace lazykv::cache {

struct ServiceLimits {
  int max_concurrent_streams = 64;  // Get and Put streams and lease waits, together
  // Of those, what one client may hold at once (a client: its token's name, else its
  // certificate's common name, else its host), so that one client cannot take them all.
  int max_streams_per_client = 32;
  int max_lookup_keys = 4096;
  uint32_t slice_bytes = 4 << 20;  // payload bytes per Get message
  std::chrono::milliseconds default_lease_ttl{10000};
  std::chrono::milliseconds max_lease_ttl{120000};
  std::chrono::milliseconds max_lease_wait{60000};
  // A Get or Put stream that moves no message for this long is cancelled (its slot and its
  // reserved space freed): a stalled client cannot hold them.
  std::chrono::milliseconds stream_idle_timeout{10000};
};

// Every call is authorized first (common/security/call_authorizer.h): Lookup, Get, Put,
// Lease, ReleaseLease, RenewLease and ReportInvalid need the worker role, Delete and
// Stats the admin role. With the fleet's chunk MAC key, a Put whose MAC does not match or
// whose payload holds a non-finite value is refused (PERMISSION_DENIED) before it is
// stored. A reported chunk is dropped unless this server can check it and it passes.
//
// Thread-safe: gRPC runs its handlers on many threads at once; the store, the lease table
// and the authorizer it uses are thread-safe, and its stream counts are atomic or locked.
class KvCacheService final : public v1::KvCache::Service {
 public:
  // `authorizer` null: every call is allowed; `mac` null: chunks are not checked here
  // (workers check them). The authorizer must outlive the service.
  KvCacheService(TieredStore* store, LeaseTable* leases, ServiceLimits limits,
                 const CallAuthorizer* authorizer = nullptr, std::shared_ptr<const ChunkMac> mac = nullptr);

  // Turns on the same-host transport (ShmSession, ShmGet; kv_cache_shm.cc) over the
  // store's shared host arena, with `shm` (which must outlive the service) holding the
  // read leases. Without it, or with a private arena, both calls answer
  // FAILED_PRECONDITION and workers use Get. Call before serving.
  void EnableShm(ShmLeaseTable* shm) { shm_ = shm; }
  // Puts the GPU tier (which must outlive the service) in front of the store: Lookup
  // reports chunks there as TIER_GPU, reads from host RAM or disk promote what they read,
  // Delete and ReportInvalid drop its copy, and GpuGet (with the same-host transport) leases
  // its pages to workers on this host. Call before serving.
  void EnableGpuTier(GpuTier* gpu) { gpu_ = gpu; }
  // Turns on PeerLinkSession and PeerGet (kv_cache_peer.cc): the GPU tier's chunks sent
  // over point-to-point links to workers on other GPUs. Needs the GPU tier; `peers` must
  // outlive the service. Call before serving.
  void EnablePeerLinks(PeerLinkTable* peers) { peers_ = peers; }

  grpc::Status Lookup(grpc::ServerContext* context, const v1::LookupRequest* request,
                      v1::LookupResponse* response) override;
  // Get streams the stored bytes without copying them (common/chunk_wire.h).
  grpc::Status StreamChunk(grpc::ServerContext* context,
                           grpc::ServerSplitStreamer<v1::GetRequest, OutgoingGetResponse>* stream);
  grpc::Status Put(grpc::ServerContext* context, grpc::ServerReader<v1::PutRequest>* reader,
                   v1::PutResponse* response) override;
  grpc::Status Lease(grpc::ServerContext* context, const v1::LeaseRequest* request,
                     v1::LeaseResponse* response) override;
  grpc::Status ReleaseLease(grpc::ServerContext* context, const v1::ReleaseLeaseRequest* request,
                            v1::ReleaseLeaseResponse* response) override;
  grpc::Status Delete(grpc::ServerContext* context, const v1::DeleteRequest* request,
                      v1::DeleteResponse* response) override;
  grpc::Status Stats(grpc::ServerContext* context, const v1::StatsRequest* request,
                     v1::StatsResponse* response) override;
  grpc::Status RenewLease(grpc::ServerContext* context, const v1::RenewLeaseRequest* request,
                          v1::RenewLeaseResponse* response) override;
  grpc::Status ReportInvalid(grpc::ServerContext* context, const v1::ReportInvalidRequest* request,
                             v1::ReportInvalidResponse* response) override;
  // The same-host transport (kv_cache_shm.cc): a session per worker, held open as long as
  // it maps the arena; read leases die with it.
  grpc::Status ShmSession(grpc::ServerContext* context,
                          grpc::ServerReaderWriter<v1::ShmSessionResponse, v1::ShmSessionRequest>* stream) override;
  grpc::Status ShmGet(grpc::ServerContext* context, const v1::ShmGetRequest* request,
                      v1::ShmGetResponse* response) override;
  grpc::Status ShmReserve(grpc::ServerContext* context, const v1::ShmReserveRequest* request,
                          v1::ShmReserveResponse* response) override;
  grpc::Status ShmCommit(grpc::ServerContext* context, const v1::ShmCommitRequest* request,
                         v1::ShmCommitResponse* response) override;
  // The GPU tier's same-host read (kv_cache_gpu.cc): page locations in its device memory
  // and a read lease held by the caller's session.
  grpc::Status GpuGet(grpc::ServerContext* context, const v1::GpuGetRequest* request,
                      v1::GpuGetResponse* response) override;
  // Chunks across GPUs (kv_cache_peer.cc): a link per worker session, held open by its
  // stream, and the GPU tier's chunks sent on it.
  grpc::Status PeerLinkSession(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::PeerLinkSessionResponse, v1::PeerLinkSessionRequest>* stream) override;
  grpc::Status PeerGet(grpc::ServerContext* context, const v1::PeerGetRequest* request,
                       v1::PeerGetResponse* response) override;

 private:
  class StreamSlot;
  grpc::Status DoPut(grpc::ServerContext* context, grpc::ServerReader<v1::PutRequest>* reader,
                     v1::PutResponse* response, const Principal& caller, StreamWatchdog::Watch& watch);
  // A stream the watchdog cancelled: counted (rejected{reason="stream_idle_timeout"}); the
  // status is for the server's own accounting, the client sees CANCELLED.
  grpc::Status IdleTimeout(const std::string& what);
  // The caller when it holds `role`; else the refusal (UNAUTHENTICATED or
  // PERMISSION_DENIED), counted as rejected{reason}.
  absl::StatusOr<Principal> Authorize(const grpc::ServerContext* context, Role role);

  TieredStore* store_;
  LeaseTable* leases_;
  ServiceLimits limits_;
  CacheMetrics& metrics_;
  // PERMISSION_DENIED unless the chunk's values are finite and (with a key) its MAC
  // matches; *failed names the check that failed ("bad_mac", "non_finite").
  absl::Status CheckTrusted(const ChunkHeader& header, std::span<const std::string_view> payload,
                            std::string* failed) const;

  std::shared_ptr<const ChunkMac> mac_;
  ShmLeaseTable* shm_ = nullptr;    // null: no same-host transport
  GpuTier* gpu_ = nullptr;          // null: no GPU tier
  PeerLinkTable* peers_ = nullptr;  // null: no links across GPUs
  // Leases `key`'s GPU tier copy to the caller's session within `share` of its bounds
  // (ShmLeaseTable::Acquire): lease, tier TIER_GPU, header, size and pages into `answer`
  // (kv_cache_gpu.cc). NOT_FOUND when the GPU tier does not hold it.
  // A nonzero `lookup_id` files the lease under that lookup (ShmLeaseTable::ReleaseLookup).
  absl::Status LeaseGpuCopy(uint64_t session_id, const std::string& caller, const Hash128& key, double share,
                            v1::ShmGetResponse* answer, uint64_t lookup_id = 0);
  // Leases the host RAM copy that `read` (a read of `key`, from host RAM or, promoted by
  // it, from disk) found to the caller's session within `share` of its bounds: lease,
  // tier, size and pages into `answer` (kv_cache_shm.cc). FAILED_PRECONDITION when the
  // chunk is not in host RAM (read from disk with no room to keep it there).
  absl::Status LeaseHostCopy(uint64_t session_id, const std::string& caller, const Hash128& key,
                             const ChunkReader& read, double share, v1::ShmGetResponse* answer, uint64_t lookup_id = 0);
  // A lookup's leases (LookupRequest.shm_session_id): the chunk, when it is in the GPU tier
  // (with `prefer_gpu`) or host RAM (`where`), leased into `result` within half the
  // session's bounds; nothing on any refusal (kv_cache_shm.cc).
  void LeaseForLookup(uint64_t session_id, uint64_t lookup_id, const std::string& caller, const Hash128& key,
                      bool prefer_gpu, const std::optional<ChunkLocation>& where, v1::LookupResult* result);
  // The GPU tier's glue (kv_cache_gpu.cc). A stored chunk just read from host RAM or disk:
  // promoted (queued), from its host pages (a read from disk put it there) rather than a
  // copy of its bytes.
  void Promote(const Hash128& key, const ChunkReader& read);
  // A chunk just published: promoted too while the GPU tier has room for it (free device
  // memory serves better than none; a full tier takes only what is read).
  void PromoteStored(const Hash128& key);
  // The GPU tier's copy read back to the host; NOT_FOUND without one.
  absl::StatusOr<std::string> ReadGpuCopy(const Hash128& key);
  // Drops `key` everywhere; true when anything held it.
  bool DeleteEverywhere(const Hash128& key);
  std::unique_ptr<CallAuthorizer> allow_all_;  // when constructed without an authorizer
  const CallAuthorizer* authorizer_;
  std::atomic<int> active_streams_{0};
  Mutex client_streams_mu_;
  absl::flat_hash_map<std::string, int> client_streams_ ABSL_GUARDED_BY(client_streams_mu_);
  std::unique_ptr<StreamWatchdog> watchdog_;  // after what its scans may touch (the contexts are the calls')
};

v1::Tier ToProtoTier(StoreTier tier);

}  // namespace lazykv::cache
