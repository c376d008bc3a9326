// RemoteChunkTier's same-host transport (DESIGN.md section 5): the session per server,
// fetches that read a chunk in place from the server's shared arena under a read lease,
// and publications written in place into pages the server reserved.
#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <iterator>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "common/grpc_util.h"
#include "common/status_macros.h"
#include "worker/tier/remote_chunk_tier.h"
#include "worker/tier/remote_chunk_tier_run.h"

namespace lazykv {
namespace {

using Clock = std::chrono::steady_clock;

// A same-host answer's chunk: device pointers into the GPU tier, or the host mapping's pages.
absl::StatusOr<ChunkBytes> Adopt(ShmClientSession& session, const v1::ShmGetResponse& answer) {
  return answer.tier() == v1::TIER_GPU ? session.AdoptGpu(answer) : session.Adopt(answer);
}

}  // namespace

std::shared_ptr<ShmClientSession> RemoteChunkTier::ShmSessionFor(Server& server) {
  MutexLock lock(&server.shm_mu);
  if (server.shm != nullptr && server.shm->alive()) return server.shm;
  server.shm.reset();  // ended: its leases died with it; chunks still held keep their mapping
  const auto now = Clock::now();
  if (now < server.shm_next_try) return nullptr;
  // Not on a hot path (once per server, then once per retry interval): the first-call
  // deadline at least, as a health probe.
  const auto deadline = std::min<std::chrono::microseconds>(
      std::max<std::chrono::microseconds>(CallDeadline(server), options_.initial_call_deadline),
      options_.lookup_deadline);
  // --transport nccl: the GPU tier only over links, so the session does not open it.
  const int gpu_device = options_.transport == FetchTransport::kNccl ? -1 : options_.gpu_device;
  auto opened = ShmClientSession::Open(server.channel, options_.holder, deadline, &options_.shm_pinner, gpu_device);
  if (!opened.ok()) {
    server.shm_next_try = now + options_.shm_retry_interval;
    if (!server.shm_logged || options_.transport == FetchTransport::kShm) {
      server.shm_logged = true;
      spdlog::info("cache server {}: no same-host transport ({}); chunks come over gRPC{}", server.address,
                   std::string(opened.status().message()),
                   options_.transport == FetchTransport::kShm ? " (--transport shm: they are computed instead)" : "");
    }
    return nullptr;
  }
  server.shm = *std::move(opened);
  spdlog::info("cache server {}: same-host transport on (arena of {} bytes mapped read-only{}, session {:016x})",
               server.address, server.shm->mapping().bytes(), server.shm->mapping().pinned() ? " and pinned" : "",
               server.shm->id());
  return server.shm;
}

absl::StatusOr<FetchedChunk> RemoteChunkTier::FetchShm(Server& server, const Hash128& key) {
  const auto start = Clock::now();
  std::shared_ptr<ShmClientSession> session = ShmSessionFor(server);
  const double setup_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (session == nullptr) {
    return absl::UnavailableError(absl::StrFormat("no same-host session with cache server %s", server.address));
  }
  v1::ShmGetRequest request;
  request.set_session_id(session->id());
  *request.mutable_key() = ToProto(key);
  request.set_prefer_gpu(session->gpu() != nullptr);
  v1::ShmGetResponse response;
  // A transfer's deadline: the server may read the chunk from disk first. No sample: the
  // estimator's throughput is that of the gRPC path.
  const Attempted call =
      Run(server, TransferDeadline(server, 0), options_.max_retries, "shm_get",
          [&](grpc::ClientContext& context) { return server.stub->ShmGet(&context, request, &response); });
  if (!call.status.ok()) {
    // FAILED_PRECONDITION also answers a chunk that is on disk only (no room in host RAM):
    // only an unknown session (ShmLeaseTable's "no shm session") ends this one.
    if (call.status.error_code() == grpc::StatusCode::FAILED_PRECONDITION &&
        absl::StrContains(call.status.error_message(), "no shm session")) {
      // The server does not know the session (it restarted, or ended it): open another
      // next time.
      MutexLock lock(&server.shm_mu);
      if (server.shm == session) server.shm.reset();
    }
    return FromGrpcStatus(call.status);
  }
  ASSIGN_OR_RETURN(ChunkBytes bytes, Adopt(*session, response));
  return SameHostFetched(server, std::move(bytes), setup_seconds);
}

FetchedChunk RemoteChunkTier::SameHostFetched(Server& server, ChunkBytes bytes, double setup_seconds) {
  const bool on_gpu = bytes.on_device();
  (on_gpu ? cuda_ipc_chunks_ : shm_chunks_).fetch_add(1);
  (on_gpu ? cuda_ipc_bytes_ : shm_bytes_).fetch_add(bytes.size());
  // Verified: the server checked the payload's checksum when it admitted the chunk to its
  // host RAM (a commit, a put, a read back from disk), and the bytes have not moved since:
  // they are read in place, in memory this worker trusts as it trusts the server's process
  // (the same user may read and write it). A second CPU pass over 64 MiB here would cost
  // more than the rest of the fetch. The MAC, when the fleet signs chunks, is still
  // checked by the pipeline, and the values on the device. The same holds for a chunk in the
  // server's GPU tier, copied there from host RAM or disk after their checks.
  return FetchedChunk{std::move(bytes), ChunkSource::kRemote, server.address, /*payload_verified=*/true, setup_seconds};
}

std::shared_ptr<ShmClientSession> RemoteChunkTier::LookupLeaseSession(Server& server) {
  // Forced transports keep their meaning: gRPC never leases; with nccl the GPU tier's
  // chunks come over links, and a lease on their host copy would bypass them.
  if (options_.lookup_lease_hold.count() <= 0 || options_.transport == FetchTransport::kGrpc ||
      options_.transport == FetchTransport::kNccl) {
    return nullptr;
  }
  // Only a session open already: opening one (mapping and pinning the arena) is not a
  // lookup's work; the first fetch or the tier's creation opens it.
  std::shared_ptr<ShmClientSession> session = CurrentShmSession(server);
  return session != nullptr && session->alive() ? session : nullptr;
}

std::shared_ptr<ShmClientSession> RemoteChunkTier::CurrentShmSession(Server& server) {
  MutexLock lock(&server.shm_mu);
  return server.shm;
}

void RemoteChunkTier::KeepLookupLease(Server& server, const Hash128& key, const v1::ShmGetResponse& lease,
                                      std::shared_ptr<ShmClientSession> session) {
  absl::StatusOr<ChunkBytes> bytes = Adopt(*session, lease);
  if (!bytes.ok()) {  // the lease went with the refused bytes; the fetch asks again
    lookup_leases_unused_.fetch_add(1);
    return;
  }
  MutexLock lock(&server.looked_up_mu);
  server.looked_up[key].push_back(Server::LookedUp{*std::move(bytes), std::move(session), Clock::now()});
}

namespace {

// Whether a kept lookup lease may still be read: not held past its time, and of the live
// session the tier uses now (an ended session's leases are gone on the server and its pages
// may be another chunk's; a session the tier replaced, the server no longer knew).
bool Usable(const std::shared_ptr<ShmClientSession>& session, Clock::time_point leased_at,
            const std::shared_ptr<ShmClientSession>& current, Clock::time_point oldest_kept) {
  return session == current && session->alive() && leased_at >= oldest_kept;
}

}  // namespace

std::optional<FetchedChunk> RemoteChunkTier::TakeLookupLease(Server& server, const Hash128& key) {
  std::optional<Server::LookedUp> taken;
  std::vector<Server::LookedUp> stale;  // released outside the lock
  const std::shared_ptr<ShmClientSession> current = CurrentShmSession(server);
  {
    MutexLock lock(&server.looked_up_mu);
    auto it = server.looked_up.find(key);
    if (it == server.looked_up.end()) return std::nullopt;
    std::vector<Server::LookedUp>& held = it->second;
    const auto oldest_kept = Clock::now() - options_.lookup_lease_hold;
    while (!held.empty() && !taken) {
      Server::LookedUp candidate = std::move(held.back());
      held.pop_back();
      if (Usable(candidate.session, candidate.leased_at, current, oldest_kept)) {
        taken = std::move(candidate);
      } else {
        stale.push_back(std::move(candidate));
      }
    }
    if (held.empty()) server.looked_up.erase(it);
  }
  lookup_leases_unused_.fetch_add(stale.size());
  if (!taken) return std::nullopt;
  lookup_leases_used_.fetch_add(1);
  return SameHostFetched(server, std::move(taken->bytes), /*setup_seconds=*/0);
}

void RemoteChunkTier::DropLookupLeases(Server& server, const Hash128& key, bool all) {
  std::vector<Server::LookedUp> dropped;  // released outside the lock
  {
    MutexLock lock(&server.looked_up_mu);
    auto it = server.looked_up.find(key);
    if (it == server.looked_up.end()) return;
    std::vector<Server::LookedUp>& held = it->second;
    // One lookup's worth unless `all`: another request may have looked the same chunk up.
    const size_t n = all ? held.size() : 1;
    std::move(held.begin(), held.begin() + static_cast<std::ptrdiff_t>(n), std::back_inserter(dropped));
    held.erase(held.begin(), held.begin() + static_cast<std::ptrdiff_t>(n));
    if (held.empty()) server.looked_up.erase(it);
  }
  lookup_leases_unused_.fetch_add(dropped.size());
}

void RemoteChunkTier::DropUnusableLookupLeases(Server& server) {
  std::vector<Server::LookedUp> dropped;  // released outside the lock
  const std::shared_ptr<ShmClientSession> current = CurrentShmSession(server);
  {
    MutexLock lock(&server.looked_up_mu);
    const auto oldest_kept = Clock::now() - options_.lookup_lease_hold;
    for (auto it = server.looked_up.begin(); it != server.looked_up.end();) {
      std::vector<Server::LookedUp>& held = it->second;
      auto usable = std::stable_partition(held.begin(), held.end(), [&](const Server::LookedUp& l) {
        return Usable(l.session, l.leased_at, current, oldest_kept);
      });
      std::move(usable, held.end(), std::back_inserter(dropped));
      held.erase(usable, held.end());
      it = held.empty() ? server.looked_up.erase(it) : std::next(it);
    }
  }
  lookup_leases_unused_.fetch_add(dropped.size());
}

void RemoteChunkTier::NotFetching(const Hash128& key) {
  if (options_.transport == FetchTransport::kGrpc) return;
  DropLookupLeases(*servers_[OwnerOf(key)], key, /*all=*/false);
}

// Pages of a same-host server's arena reserved for one chunk, mapped writable until Commit.
// Destroyed without Commit, the reservation is abandoned (its pages go back).
class RemoteChunkTier::ShmPublishSlot final : public PublishSlot {
 public:
  ShmPublishSlot(RemoteChunkTier* tier, Server* server, std::shared_ptr<ShmClientSession> session,
                 uint64_t reservation_id, uint64_t bytes, std::unique_ptr<ShmArenaMapping::WritablePages> pages)
      : tier_(tier),
        server_(server),
        session_(std::move(session)),
        reservation_id_(reservation_id),
        bytes_(bytes),
        pages_(std::move(pages)) {}
  ~ShmPublishSlot() override {
    if (!committed_) session_->Abandon(reservation_id_);
  }
  const MutablePieces& Pieces() override {
    static const MutablePieces kUnmapped;  // after Commit: nothing is writable any more
    return pages_ != nullptr ? pages_->pieces() : kUnmapped;
  }
  absl::Status Commit() override {
    if (committed_) return absl::FailedPreconditionError("publish slot committed twice");
    committed_ = true;  // committed or refused, the reservation is gone from the server
    pages_.reset();     // no write reaches the pages once the server checks them
    return tier_->CommitShm(*server_, *session_, reservation_id_, bytes_);
  }

 private:
  RemoteChunkTier* tier_;
  Server* server_;
  std::shared_ptr<ShmClientSession> session_;
  uint64_t reservation_id_;
  uint64_t bytes_;
  std::unique_ptr<ShmArenaMapping::WritablePages> pages_;
  bool committed_ = false;
};

// A reservation for a chunk the server already stores: the bytes go nowhere.
class DiscardPublishSlot final : public PublishSlot {
 public:
  explicit DiscardPublishSlot(uint64_t bytes) : bytes_(bytes, '\0') {
    pieces_.emplace_back(bytes_.data(), bytes_.size());
  }
  const MutablePieces& Pieces() override { return pieces_; }
  absl::Status Commit() override { return absl::OkStatus(); }

 private:
  std::string bytes_;
  MutablePieces pieces_;
};

absl::StatusOr<std::unique_ptr<PublishSlot>> RemoteChunkTier::BeginPublish(const Hash128& key,
                                                                           const Hash128& model_fingerprint,
                                                                           uint64_t stored_bytes, uint64_t lease_id) {
  if (options_.transport == FetchTransport::kGrpc) {
    return ChunkTier::BeginPublish(key, model_fingerprint, stored_bytes, lease_id);
  }
  Server& server = *servers_[OwnerOf(key)];
  if (!Up(server)) return absl::UnavailableError(absl::StrFormat("cache server %s is down", server.address));
  const bool forced = options_.transport == FetchTransport::kShm;
  std::shared_ptr<ShmClientSession> session = ShmSessionFor(server);
  if (session == nullptr) {
    if (forced) return absl::UnavailableError(absl::StrFormat("no same-host session with %s", server.address));
    return ChunkTier::BeginPublish(key, model_fingerprint, stored_bytes, lease_id);
  }
  v1::ShmReserveRequest request;
  request.set_session_id(session->id());
  *request.mutable_key() = ToProto(key);
  *request.mutable_model_fingerprint() = ToProto(model_fingerprint);
  request.set_lease_id(lease_id);
  request.set_stored_bytes(stored_bytes);
  v1::ShmReserveResponse response;
  // The server may wait for room (its space_wait): a transfer's deadline.
  const Attempted call =
      Run(server, TransferDeadline(server, stored_bytes), options_.max_retries, "shm_reserve",
          [&](grpc::ClientContext& context) { return server.stub->ShmReserve(&context, request, &response); });
  if (!call.status.ok()) {
    const grpc::StatusCode code = call.status.error_code();
    if (code == grpc::StatusCode::FAILED_PRECONDITION) {
      MutexLock lock(&server.shm_mu);
      if (server.shm == session) server.shm.reset();
    }
    const bool fall_back =
        code == grpc::StatusCode::RESOURCE_EXHAUSTED || code == grpc::StatusCode::FAILED_PRECONDITION;
    if (forced || !fall_back || !Up(server)) return FromGrpcStatus(call.status);
    return ChunkTier::BeginPublish(key, model_fingerprint, stored_bytes, lease_id);
  }
  if (response.already_stored()) return std::unique_ptr<PublishSlot>(new DiscardPublishSlot(stored_bytes));
  auto pages = session->mapping().MapWritable(std::span<const uint32_t>(response.pages().data(), response.pages_size()),
                                              stored_bytes);
  if (!pages.ok()) {
    session->Abandon(response.reservation_id());
    if (forced) return pages.status();
    return ChunkTier::BeginPublish(key, model_fingerprint, stored_bytes, lease_id);
  }
  return std::unique_ptr<PublishSlot>(new ShmPublishSlot(this, &server, std::move(session), response.reservation_id(),
                                                         stored_bytes, *std::move(pages)));
}

absl::Status RemoteChunkTier::CommitShm(Server& server, ShmClientSession& session, uint64_t reservation_id,
                                        uint64_t bytes) {
  v1::ShmCommitRequest request;
  request.set_session_id(session.id());
  request.set_reservation_id(reservation_id);
  v1::ShmCommitResponse response;
  // Checks a whole chunk (checksum; MAC with the key): a transfer's deadline. Not
  // retried: the reservation is taken by the first try.
  const Attempted call =
      Run(server, TransferDeadline(server, bytes), 0, "shm_commit",
          [&](grpc::ClientContext& context) { return server.stub->ShmCommit(&context, request, &response); });
  if (call.status.ok()) {
    shm_published_chunks_.fetch_add(1);
    shm_published_bytes_.fetch_add(bytes);
  }
  return FromGrpcStatus(call.status);
}

}  // namespace lazykv
