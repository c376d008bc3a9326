#include "worker/tier/remote_chunk_tier.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/chunk_codec.h"
#include "common/chunk_wire.h"
#include "common/grpc_util.h"
#include "common/rendezvous_hash.h"
#include "common/splitmix64.h"
#include "worker/tier/remote_chunk_tier_run.h"

namespace lazykv {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

absl::StatusOr<std::vector<std::string>> ParseServerList(std::string_view list) {
  std::vector<std::string> servers;
  for (absl::string_view entry :
       absl::StrSplit(absl::string_view(list.data(), list.size()), ',', absl::SkipWhitespace())) {
    const std::string server(absl::StripAsciiWhitespace(entry));
    const size_t colon = server.rfind(':');
    int port = 0;
    if (colon == std::string::npos || colon == 0 || !absl::SimpleAtoi(server.substr(colon + 1), &port) || port <= 0 ||
        port > 65535) {
      return absl::InvalidArgumentError(absl::StrFormat("--cache-servers: '%s' is not HOST:PORT", server));
    }
    servers.push_back(server);
  }
  if (servers.empty()) return absl::InvalidArgumentError("--cache-servers: no servers given");
  return servers;
}

absl::StatusOr<std::unique_ptr<RemoteChunkTier>> RemoteChunkTier::Create(RemoteTierOptions options) {
  if (options.servers.empty()) return absl::InvalidArgumentError("remote cache tier needs at least one server");
  return std::unique_ptr<RemoteChunkTier>(new RemoteChunkTier(std::move(options)));
}

RemoteChunkTier::RemoteChunkTier(RemoteTierOptions options) : options_(std::move(options)) {
  const DeadlinePolicy policy{.initial_call = options_.initial_call_deadline,
                              .min_call = options_.min_call_deadline,
                              .max_call = options_.lookup_deadline,
                              .max_transfer = options_.transfer_deadline};
  // Loads NCCL now, if it may be used, before this tier starts threads of its own: loading
  // sets NCCL_NVLS_ENABLE in the environment (nccl_library.cc).
  if (options_.peer_link_kind == "nccl" && options_.gpu_device >= 0 && options_.transport != FetchTransport::kGrpc) {
    (void)PeerLinkAvailable("nccl");
  }
  for (const std::string& address : options_.servers) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(static_cast<int>(options_.slice_bytes + (1 << 20)));
    args.SetMaxSendMessageSize(static_cast<int>(options_.slice_bytes + (1 << 20)));
    args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 8 << 20);  // MiB-sized chunks
    // Notice a restarted server within about a second.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    auto server = std::make_unique<Server>(policy);
    server->address = address;
    server->channel = MakeClientChannel(address, options_.security, args);
    server->stub = v1::KvCache::NewStub(server->channel);
    server->health = grpc::health::v1::Health::NewStub(server->channel);
    servers_.push_back(std::move(server));
  }
  // Same-host sessions are opened before the tier serves (each within a call deadline), so
  // the first fetches do not wait for an arena to be mapped and page-locked (a second or
  // more for tens of GiB) while the requests behind them give up and compute.
  if (options_.transport != FetchTransport::kGrpc) {
    for (const auto& server : servers_) {
      if (ShmSessionFor(*server) != nullptr) continue;
      // Not up yet, perhaps (started beside this worker): the first fetch tries again
      // rather than waiting out the retry interval.
      MutexLock lock(&server->shm_mu);
      server->shm_next_try = {};
    }
  }
  const bool nccl = options_.peer_link_kind == "nccl";
  peer_staging_ = StagingPool::Create(nccl ? std::max(options_.gpu_device, 0) : -1, options_.peer_staging_bytes);

  if (options_.transport == FetchTransport::kNccl) {
    for (const auto& server : servers_) (void)PeerSessionFor(*server);  // opened in the background
  }
  prober_ = std::thread([this] { ProberLoop(); });
}

RemoteChunkTier::~RemoteChunkTier() {
  {
    MutexLock lock(&prober_mu_);
    stopping_ = true;
    if (probe_ != nullptr) probe_->TryCancel();
  }
  prober_wake_.SignalAll();
  prober_.join();
}

uint64_t RemoteChunkTier::NextLookupId() {
  // Distinct per lookup within this tier's sessions (SplitMix64 is a bijection of its state).
  uint64_t state = lookups_.fetch_add(1) + 1;
  const uint64_t id = SplitMix64(state);
  return id != 0 ? id : 1;
}

size_t RemoteChunkTier::OwnerOf(const Hash128& key) const { return RendezvousOwner(key, options_.servers); }

std::vector<ServerEstimate> RemoteChunkTier::Estimates() const {
  std::vector<ServerEstimate> out;
  for (const auto& server : servers_) {
    MutexLock lock(&server->mu);
    out.push_back(ServerEstimate{server->address, server->up, server->estimator.latency_ms(),
                                 server->estimator.bandwidth_bytes_per_s()});
  }
  return out;
}

bool RemoteChunkTier::Up(Server& server) {
  MutexLock lock(&server.mu);
  return server.up;
}

std::chrono::microseconds RemoteChunkTier::CallDeadline(Server& server) {
  MutexLock lock(&server.mu);
  return server.estimator.CallDeadline();
}

std::chrono::microseconds RemoteChunkTier::TransferDeadline(Server& server, uint64_t bytes) {
  MutexLock lock(&server.mu);
  return server.estimator.TransferDeadline(bytes);
}

void RemoteChunkTier::MarkDown(Server& server, const grpc::Status& status, std::string_view call) {
  size_t cancelled = 0;
  {
    MutexLock lock(&server.mu);
    if (!server.up) return;
    server.up = false;
    for (grpc::ClientContext* context : server.in_flight) context->TryCancel();
    cancelled = server.in_flight.size();
  }
  spdlog::warn(
      "cache server {} is down: {} failed ({}: {}); {} calls under way cancelled; its keys are misses until it answers "
      "a health check",
      server.address, std::string(call), static_cast<int>(status.error_code()), status.error_message(), cancelled);
  MutexLock lock(&prober_mu_);
  prober_wake_.Signal();
}

bool RemoteChunkTier::AnyDown() const {
  for (const auto& server : servers_) {
    MutexLock lock(&server->mu);
    if (!server->up) return true;
  }
  return false;
}

void RemoteChunkTier::ProberLoop() {
  MutexLock lock(&prober_mu_);
  const bool lookups_lease = options_.lookup_lease_hold.count() > 0;
  // Lookup leases past their hold are dropped also while a server is down (the sweep below
  // runs only while none is).
  auto sweep = [&] {
    if (!lookups_lease) return;
    for (const auto& server : servers_) DropUnusableLookupLeases(*server);
  };
  while (true) {
    while (!stopping_ && !AnyDown()) {
      if (!lookups_lease) {
        prober_wake_.Wait(&prober_mu_);
        continue;
      }
      // Lookup leases no fetch took are dropped within twice their hold, also while no
      // lookup comes to sweep them (an idle worker holds no server pages for long).
      prober_wake_.WaitUntil(&prober_mu_, Clock::now() + options_.lookup_lease_hold);
      if (stopping_) return;
      lock.Unlock();
      sweep();
      lock.Lock();
    }
    // A server that has just failed is not asked again at once.
    const auto next = Clock::now() + options_.probe_interval;
    while (!stopping_ && Clock::now() < next) prober_wake_.WaitUntil(&prober_mu_, next);
    if (stopping_) return;
    lock.Unlock();
    for (const auto& server : servers_) {
      if (!Up(*server)) Probe(*server);
    }
    sweep();
    lock.Lock();
  }
}

void RemoteChunkTier::Probe(Server& server) {
  // Not on any request's path: at least the first-call deadline, so that a server a
  // little slower than its old estimate can come back (its answer updates the estimate).
  const auto deadline = std::min<std::chrono::microseconds>(
      std::max<std::chrono::microseconds>(CallDeadline(server), options_.initial_call_deadline),
      options_.lookup_deadline);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + deadline);
  {
    MutexLock lock(&prober_mu_);
    if (stopping_) return;
    probe_ = &context;  // the destructor cancels it
  }
  grpc::health::v1::HealthCheckRequest request;
  grpc::health::v1::HealthCheckResponse response;
  const auto start = Clock::now();
  const grpc::Status status = server.health->Check(&context, request, &response);
  const auto elapsed = Clock::now() - start;
  {
    MutexLock lock(&prober_mu_);
    probe_ = nullptr;
  }
  if (!status.ok() || response.status() != grpc::health::v1::HealthCheckResponse::SERVING) return;
  {
    MutexLock lock(&server.mu);
    server.estimator.ObserveCall(elapsed);
    server.up = true;
  }
  spdlog::info("cache server {} is back (health check answered in {:.1f} ms)", server.address,
               std::chrono::duration<double, std::milli>(elapsed).count());
}

std::vector<std::optional<TierHit>> RemoteChunkTier::Lookup(std::span<const Hash128> keys) {
  std::vector<std::optional<TierHit>> out(keys.size());
  std::vector<std::vector<size_t>> by_owner(servers_.size());
  for (size_t i = 0; i < keys.size(); ++i) by_owner[OwnerOf(keys[i])].push_back(i);
  for (size_t s = 0; s < servers_.size(); ++s) {
    Server& server = *servers_[s];
    if (by_owner[s].empty() || !Up(server)) continue;
    DropUnusableLookupLeases(server);  // those held past their time
    v1::LookupRequest request;
    for (size_t i : by_owner[s]) *request.add_keys() = ToProto(keys[i]);
    std::shared_ptr<ShmClientSession> session = LookupLeaseSession(server);
    if (session != nullptr) {
      request.set_shm_session_id(session->id());
      request.set_prefer_gpu(session->gpu() != nullptr);
      // A GPU-tier chunk this worker cannot open comes over a peer link where it wants one.
      request.set_gpu_chunks_from_host(session->gpu() == nullptr && !WantsPeerLink(server));
    }
    v1::LookupResponse response;
    // Each try of a leasing lookup has an id of its own, so that the leases of a try whose
    // answer was lost (it may have leased) are released by it alone.
    std::vector<uint64_t> tries;
    const Attempted call =
        Run(server, CallDeadline(server), options_.max_retries, "lookup", [&](grpc::ClientContext& context) {
          if (session != nullptr) {
            request.set_lookup_id(NextLookupId());
            tries.push_back(request.lookup_id());
          }
          return server.stub->Lookup(&context, request, &response);
        });
    const bool answered = call.status.ok() && response.results_size() == static_cast<int>(by_owner[s].size());
    if (session != nullptr) {
      if (answered) {
        for (int j = 0; j < response.results_size(); ++j) {
          const v1::LookupResult& r = response.results(j);
          if (r.lease().lease_id() != 0) KeepLookupLease(server, keys[by_owner[s][j]], r.lease(), session);
        }
        tries.pop_back();  // the answered try: its leases are kept
      }
      // Tries without an answer, or with one that cannot be used: whatever the server leased
      // under them is released by their ids.
      for (uint64_t lost : tries) session->ReleaseLookup(lost);
    }
    if (!answered) continue;
    MutexLock lock(&server.mu);
    server.estimator.ObserveCall(call.elapsed);
    for (size_t j = 0; j < by_owner[s].size(); ++j) {
      const v1::LookupResult& r = response.results(static_cast<int>(j));
      if (!r.found()) continue;
      out[by_owner[s][j]] = TierHit{ChunkSource::kRemote, r.stored_bytes(), server.address,
                                    r.tier() == v1::TIER_DISK   ? "disk"
                                    : r.tier() == v1::TIER_HOST ? "host"
                                    : r.tier() == v1::TIER_GPU  ? "gpu"
                                                                : ""};
      server.estimator.ObserveChunkSize(r.stored_bytes());
    }
  }
  return out;
}

absl::StatusOr<FetchedChunk> RemoteChunkTier::Fetch(const Hash128& key) {
  Server& server = *servers_[OwnerOf(key)];
  if (!Up(server)) return absl::UnavailableError(absl::StrFormat("cache server %s is down", server.address));
  if (options_.transport == FetchTransport::kGrpc) return FetchGrpc(server, key);
  // A lease the lookup took: the chunk is readable in place now, with no call.
  if (std::optional<FetchedChunk> leased = TakeLookupLease(server, key)) return *std::move(leased);
  if (WantsPeerLink(server)) {
    absl::StatusOr<FetchedChunk> peer = FetchPeer(server, key);
    // Otherwise not in its GPU tier, no link yet, or a link that failed (it reopens later):
    // the other transports serve it, unless the server itself is sick.
    if (peer.ok() || !Up(server)) return peer;
  }
  absl::StatusOr<FetchedChunk> shm = FetchShm(server, key);
  if (shm.ok() || options_.transport == FetchTransport::kShm) return shm;
  const absl::StatusCode code = shm.status().code();
  // A miss or a sick server is the same answer over gRPC: not asked twice.
  if (code == absl::StatusCode::kNotFound || code == absl::StatusCode::kDataLoss || !Up(server)) return shm;
  if (code != absl::StatusCode::kUnavailable) shm_fallbacks_.fetch_add(1);  // UNAVAILABLE: no session
  return FetchGrpc(server, key);
}

absl::StatusOr<FetchedChunk> RemoteChunkTier::FetchGrpc(Server& server, const Hash128& key) {
  v1::GetRequest request;
  *request.mutable_key() = ToProto(key);
  std::string stored;
  const Attempted call =
      Run(server, TransferDeadline(server, 0), options_.max_retries, "get", [&](grpc::ClientContext& context) {
        stored.clear();
        v1::Tier tier = v1::TIER_UNSPECIFIED;
        return GetChunkInto(server.channel.get(), &context, request, &stored, &tier);
      });
  if (!call.status.ok()) return FromGrpcStatus(call.status);
  {
    MutexLock lock(&server.mu);
    server.estimator.ObserveTransfer(stored.size(), call.elapsed);
  }
  grpc_chunks_.fetch_add(1);
  grpc_bytes_.fetch_add(stored.size());
  return FetchedChunk{ChunkBytes::FromString(std::move(stored)), ChunkSource::kRemote, server.address};
}

TransportStats RemoteChunkTier::transport_stats() const {
  TransportStats out{.grpc_chunks = grpc_chunks_.load(),
                     .grpc_bytes = grpc_bytes_.load(),
                     .shm_chunks = shm_chunks_.load(),
                     .shm_bytes = shm_bytes_.load(),
                     .cuda_ipc_chunks = cuda_ipc_chunks_.load(),
                     .cuda_ipc_bytes = cuda_ipc_bytes_.load(),
                     .nccl_chunks = nccl_chunks_.load(),
                     .nccl_bytes = nccl_bytes_.load(),
                     .shm_fallbacks = shm_fallbacks_.load(),
                     .lookup_leases_used = lookup_leases_used_.load(),
                     .lookup_leases_unused = lookup_leases_unused_.load(),
                     .shm_published_chunks = shm_published_chunks_.load(),
                     .shm_published_bytes = shm_published_bytes_.load()};
  for (const auto& server : servers_) {
    {
      MutexLock lock(&server->shm_mu);
      if (server->shm != nullptr && server->shm->alive()) ++out.shm_sessions;
    }
    MutexLock lock(&server->peer_mu);
    for (const Server::PeerSlot& slot : server->peers) {
      if (slot.session != nullptr && slot.session->state() == PeerLinkClientSession::State::kReady) ++out.peer_sessions;
    }
  }
  return out;
}

LeaseAnswer RemoteChunkTier::Lease(const Hash128& key, std::chrono::milliseconds ttl, std::chrono::milliseconds wait) {
  Server& server = *servers_[OwnerOf(key)];
  if (!Up(server)) return {LeaseAnswer::State::kUnavailable};
  v1::LeaseRequest request;
  *request.mutable_key() = ToProto(key);
  request.set_holder(options_.holder);
  request.set_ttl_ms(static_cast<uint32_t>(ttl.count()));
  request.set_wait_ms(static_cast<uint32_t>(wait.count()));
  v1::LeaseResponse response;
  const Attempted call =
      Run(server, CallDeadline(server) + wait, options_.max_retries, "lease",
          [&](grpc::ClientContext& context) { return server.stub->Lease(&context, request, &response); });
  if (!call.status.ok()) return {LeaseAnswer::State::kUnavailable};
  if (wait.count() == 0) {  // a wait would count as latency
    MutexLock lock(&server.mu);
    server.estimator.ObserveCall(call.elapsed);
  }
  const std::chrono::milliseconds remaining(response.expires_in_ms());
  switch (response.outcome()) {
    case v1::LeaseResponse::GRANTED:
      return {LeaseAnswer::State::kGranted, response.lease_id(), remaining};
    case v1::LeaseResponse::STORED:
      return {LeaseAnswer::State::kStored};
    case v1::LeaseResponse::HELD:
      return {LeaseAnswer::State::kHeld, response.lease_id(), remaining};
    default:
      return {LeaseAnswer::State::kUnavailable};
  }
}

void RemoteChunkTier::ReleaseLease(const Hash128& key, uint64_t lease_id) {
  Server& server = *servers_[OwnerOf(key)];
  if (!Up(server)) return;  // the lease expires by itself
  v1::ReleaseLeaseRequest request;
  *request.mutable_key() = ToProto(key);
  request.set_lease_id(lease_id);
  v1::ReleaseLeaseResponse response;
  // No retry: an expired lease needs no release.
  const Attempted call = Run(server, CallDeadline(server), 0, "release", [&](grpc::ClientContext& context) {
    return server.stub->ReleaseLease(&context, request, &response);
  });
  if (call.status.ok()) {
    MutexLock lock(&server.mu);
    server.estimator.ObserveCall(call.elapsed);
  }
}

absl::Status RemoteChunkTier::RenewLease(const Hash128& key, uint64_t lease_id, std::chrono::milliseconds ttl) {
  Server& server = *servers_[OwnerOf(key)];
  if (!Up(server)) return absl::UnavailableError(absl::StrFormat("cache server %s is down", server.address));
  v1::RenewLeaseRequest request;
  *request.mutable_key() = ToProto(key);
  request.set_lease_id(lease_id);
  request.set_ttl_ms(static_cast<uint32_t>(ttl.count()));
  v1::RenewLeaseResponse response;
  // No retry, and well inside the TTL: a renewal that would land late is worth nothing,
  // and one slow server must not hold up the renewals of the others' leases.
  const auto deadline = std::min<std::chrono::microseconds>(CallDeadline(server), ttl / 3);
  const Attempted call = Run(server, deadline, 0, "renew", [&](grpc::ClientContext& context) {
    return server.stub->RenewLease(&context, request, &response);
  });
  if (call.status.ok()) {
    MutexLock lock(&server.mu);
    server.estimator.ObserveCall(call.elapsed);
  }
  return FromGrpcStatus(call.status);
}

void RemoteChunkTier::ReportInvalid(const Hash128& key, std::string_view header, std::string_view reason) {
  Server& server = *servers_[OwnerOf(key)];
  // Other lookups' leases of this chunk hold the same refused bytes: none is fetched.
  if (options_.transport != FetchTransport::kGrpc) DropLookupLeases(server, key, /*all=*/true);
  if (!Up(server)) return;
  v1::ReportInvalidRequest request;
  *request.mutable_key() = ToProto(key);
  request.set_header(std::string(header));
  request.set_reason(std::string(reason));
  v1::ReportInvalidResponse response;
  const Attempted call = Run(server, CallDeadline(server), 0, "report", [&](grpc::ClientContext& context) {
    return server.stub->ReportInvalid(&context, request, &response);
  });
  if (call.status.ok() && response.deleted()) {
    spdlog::info("cache server {} dropped chunk {} this worker refused ({})", server.address, key.ToHex(),
                 std::string(reason));
  }
}

absl::Status RemoteChunkTier::Publish(const Hash128& key, const Hash128& model_fingerprint, std::string_view stored,
                                      uint64_t lease_id) {
  Server& server = *servers_[OwnerOf(key)];
  if (!Up(server)) return absl::UnavailableError(absl::StrFormat("cache server %s is down", server.address));
  if (stored.size() < kChunkHeaderBytes) return absl::InvalidArgumentError("publish: chunk shorter than its header");
  const std::string_view bytes(stored);
  // A chunk the server refuses (too large: RESOURCE_EXHAUSTED or INVALID_ARGUMENT; a lost
  // lease: FAILED_PRECONDITION) is not retried: Run retries only UNAVAILABLE and ABORTED.
  const Attempted call = Run(server, TransferDeadline(server, stored.size()), options_.max_retries, "put",
                             [&](grpc::ClientContext& context) {
                               v1::PutResponse response;
                               return PutChunkSlices(*server.stub, &context, ToProto(key), ToProto(model_fingerprint),
                                                     lease_id, bytes.substr(0, kChunkHeaderBytes),
                                                     bytes.substr(kChunkHeaderBytes), options_.slice_bytes, &response);
                             });
  if (call.status.ok()) {
    MutexLock lock(&server.mu);
    server.estimator.ObserveTransfer(stored.size(), call.elapsed);
  }
  return FromGrpcStatus(call.status);
}

std::string RemoteChunkTier::Describe() const {
  return absl::StrFormat("cache servers %s (transport %s)", absl::StrJoin(options_.servers, ","),
                         FetchTransportName(options_.transport));
}

}  // namespace lazykv
