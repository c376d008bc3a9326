#include "cache_server/kv_cache_service.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/chunk_values.h"
#include "common/grpc_util.h"

namespace lazykv::cache {
namespace {

using Clock = std::chrono::steady_clock;

grpc::Status Invalid(const std::string& message) { return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, message); }

// Observes a call's latency when it goes out of scope.
class LatencyTimer {
 public:
  LatencyTimer(CacheMetrics& metrics, std::string method)
      : metrics_(metrics), method_(std::move(method)), start_(Clock::now()) {}
  ~LatencyTimer() { metrics_.ObserveLatency(method_, std::chrono::duration<double>(Clock::now() - start_).count()); }

 private:
  CacheMetrics& metrics_;
  std::string method_;
  Clock::time_point start_;
};

}  // namespace

v1::Tier ToProtoTier(StoreTier tier) { return tier == StoreTier::kHost ? v1::TIER_HOST : v1::TIER_DISK; }

// A place among the bounded number of concurrent streams, and among the client's share of
// them, held for a call's duration.
class KvCacheService::StreamSlot {
 public:
  StreamSlot(KvCacheService* service, std::string client) : service_(service), client_(std::move(client)) {
    const ServiceLimits& limits = service_->limits_;
    in_total_ = service_->active_streams_.fetch_add(1) < limits.max_concurrent_streams;
    if (in_total_) {
      MutexLock lock(&service_->client_streams_mu_);
      in_share_ = ++service_->client_streams_[client_] <= limits.max_streams_per_client;
    } else {
      in_share_ = true;
    }
    service_->metrics_.active_streams->Set(service_->active_streams_.load());
  }
  ~StreamSlot() {
    if (in_total_) {
      MutexLock lock(&service_->client_streams_mu_);
      auto it = service_->client_streams_.find(client_);
      if (--it->second == 0) service_->client_streams_.erase(it);
    }
    service_->active_streams_.fetch_sub(1);
    service_->metrics_.active_streams->Set(service_->active_streams_.load());
  }
  grpc::Status Refusal() const {
    const ServiceLimits& limits = service_->limits_;
    if (!in_total_) {
      service_->metrics_.CountRejected("max_concurrent_streams");
      return grpc::Status(
          grpc::StatusCode::RESOURCE_EXHAUSTED,
          absl::StrFormat("server is at max_concurrent_streams=%d; retry later", limits.max_concurrent_streams));
    }
    service_->metrics_.CountRejected("max_streams_per_client");
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        absl::StrFormat("client '%s' is at max_streams_per_client=%d; retry later", client_,
                                        limits.max_streams_per_client));
  }
  bool taken() const { return in_total_ && in_share_; }

 private:
  KvCacheService* service_;
  std::string client_;
  bool in_total_;
  bool in_share_;
};

absl::StatusOr<Principal> KvCacheService::Authorize(const grpc::ServerContext* context, Role role) {
  absl::StatusOr<Principal> caller = authorizer_->Authorize(*context, role);
  if (!caller.ok()) {
    metrics_.CountRejected(caller.status().code() == absl::StatusCode::kPermissionDenied ? "permission_denied"
                                                                                         : "unauthenticated");
  }
  return caller;
}

grpc::Status KvCacheService::IdleTimeout(const std::string& what) {
  metrics_.CountRejected("stream_idle_timeout");
  return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, absl::StrFormat("%s for stream_idle_timeout=%dms; cancelled",
                                                                           what, limits_.stream_idle_timeout.count()));
}

KvCacheService::KvCacheService(TieredStore* store, LeaseTable* leases, ServiceLimits limits,
                               const CallAuthorizer* authorizer, std::shared_ptr<const ChunkMac> mac)
    : store_(store),
      leases_(leases),
      limits_(limits),
      metrics_(store->metrics()),
      mac_(std::move(mac)),
      allow_all_(authorizer == nullptr ? CallAuthorizer::AllowAll() : nullptr),
      authorizer_(authorizer == nullptr ? allow_all_.get() : authorizer),
      watchdog_(std::make_unique<StreamWatchdog>(limits.stream_idle_timeout)) {
  // Method 1 of KvCache is Get (proto/kvcache.proto): served by StreamChunk.
  MarkMethodStreamed(1, new grpc::internal::SplitServerStreamingHandler<v1::GetRequest, OutgoingGetResponse>(
                            [this](grpc::ServerContext* context,
                                   grpc::ServerSplitStreamer<v1::GetRequest, OutgoingGetResponse>* stream) {
                              return StreamChunk(context, stream);
                            }));
}

grpc::Status KvCacheService::Lookup(grpc::ServerContext* context, const v1::LookupRequest* request,
                                    v1::LookupResponse* response) {
  LatencyTimer timer(metrics_, "lookup");
  auto caller = Authorize(context, Role::kWorker);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  if (request->keys_size() > limits_.max_lookup_keys) {
    metrics_.CountRejected("max_lookup_keys");
    return Invalid(
        absl::StrFormat("keys: %d keys exceed max_lookup_keys=%d", request->keys_size(), limits_.max_lookup_keys));
  }
  const uint64_t session = request->shm_session_id();
  for (const v1::Hash128& proto_key : request->keys()) {
    const Hash128 key = FromProto(proto_key);
    v1::LookupResult* result = response->add_results();
    if (gpu_ != nullptr) {
      if (std::shared_ptr<const GpuValue> on_gpu = gpu_->Find(key)) {
        metrics_.lookups->Increment();
        metrics_.gpu.hits->Increment();
        result->set_found(true);
        result->set_tier(v1::TIER_GPU);
        result->set_stored_bytes(on_gpu->size());
        // Without prefer_gpu the worker may fetch the GPU copy over a peer link instead.
        if (session != 0 && (request->prefer_gpu() || request->gpu_chunks_from_host())) {
          LeaseForLookup(session, request->lookup_id(), caller->name, key, request->prefer_gpu(), store_->Locate(key),
                         result);
        }
        continue;
      }
    }
    if (const auto where = store_->Lookup(key)) {
      result->set_found(true);
      result->set_tier(ToProtoTier(where->tier));
      result->set_stored_bytes(where->bytes);
      if (session != 0) {
        LeaseForLookup(session, request->lookup_id(), caller->name, key, /*prefer_gpu=*/false, where, result);
      }
    }
  }
  if (session != 0 && context->IsCancelled()) {
    // The caller gave up (its deadline passed): nobody will adopt these leases.
    for (const v1::LookupResult& result : response->results()) {
      if (result.lease().lease_id() != 0) shm_->Release(session, result.lease().lease_id());
    }
    return grpc::Status(grpc::StatusCode::CANCELLED, "the lookup was cancelled; its leases are released");
  }
  return grpc::Status::OK;
}

grpc::Status KvCacheService::StreamChunk(grpc::ServerContext* context,
                                         grpc::ServerSplitStreamer<v1::GetRequest, OutgoingGetResponse>* stream) {
  LatencyTimer timer(metrics_, "get");
  auto caller = Authorize(context, Role::kWorker);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  StreamSlot slot(this, caller->name);
  if (!slot.taken()) return slot.Refusal();
  StreamWatchdog::Watch watch(watchdog_.get(), context);
  v1::GetRequest request;
  if (!stream->Read(&request)) return Invalid("empty get request");
  if (!request.has_key()) return Invalid("key is required");
  const Hash128 key = FromProto(request.key());
  auto read = store_->Read(key);
  if (read.ok()) {
    Promote(key, *read);
  } else if (read.status().code() == absl::StatusCode::kNotFound) {
    // Only the GPU tier holds it (rare: what it evicts without a lower copy is demoted, so
    // this is the moment in between, or host RAM evicted it since its promotion).
    absl::StatusOr<std::string> bytes = ReadGpuCopy(key);
    read = bytes.ok() ? absl::StatusOr<ChunkReader>(ChunkReader(StoreTier::kHost, *std::move(bytes))) : bytes.status();
  }
  if (!read.ok()) return ToGrpcStatus(read.status());
  const auto reader = std::make_shared<const ChunkReader>(*std::move(read));
  const uint64_t size = reader->size();
  metrics_.grpc_sent.chunks->Increment();
  metrics_.grpc_sent.bytes->Increment(static_cast<double>(size));
  OutgoingGetResponse message;
  message.header.resize(kChunkHeaderBytes);
  reader->Read(0, kChunkHeaderBytes, message.header.data());
  message.tier = ToProtoTier(reader->tier());
  message.owner = reader;
  uint64_t offset = kChunkHeaderBytes;
  do {
    const uint64_t n = std::min<uint64_t>(limits_.slice_bytes, size - offset);
    message.data = reader->Pieces(offset, n);
    offset += n;
    if (context->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "client cancelled the get");
    grpc::WriteOptions options;
    if (offset == size) options.set_last_message();
    if (!stream->Write(message, options)) {
      if (watch.timed_out()) return IdleTimeout("get: the client read nothing");
      return grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
    }
    watch.Progress();
    message.header.clear();
    message.tier = v1::TIER_UNSPECIFIED;
  } while (offset < size);
  return grpc::Status::OK;
}

grpc::Status KvCacheService::Put(grpc::ServerContext* context, grpc::ServerReader<v1::PutRequest>* reader,
                                 v1::PutResponse* response) {
  LatencyTimer timer(metrics_, "put");
  auto caller = Authorize(context, Role::kWorker);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  StreamSlot slot(this, caller->name);
  if (!slot.taken()) return slot.Refusal();
  StreamWatchdog::Watch watch(watchdog_.get(), context);
  const grpc::Status status = DoPut(context, reader, response, *caller, watch);
  if (!status.ok() && watch.timed_out()) return IdleTimeout("put: the client sent nothing");
  return status;
}

grpc::Status KvCacheService::DoPut(grpc::ServerContext* context, grpc::ServerReader<v1::PutRequest>* reader,
                                   v1::PutResponse* response, const Principal& caller, StreamWatchdog::Watch& watch) {
  v1::PutRequest message;
  if (!reader->Read(&message)) return Invalid("empty put stream: the first message must carry key and header");
  watch.Progress();
  if (!message.has_key()) return Invalid("key is required in the first message");
  if (!message.has_model_fingerprint()) return Invalid("model_fingerprint is required in the first message");
  const Hash128 key = FromProto(message.key());
  auto header = DecodeChunkHeader(message.header());
  if (!header.ok()) {
    return grpc::Status(static_cast<grpc::StatusCode>(header.status().code()),
                        absl::StrFormat("header: %s", std::string(header.status().message())));
  }
  if (message.header().size() != kChunkHeaderBytes) {
    return Invalid(
        absl::StrFormat("header: %d bytes, expected exactly %d", message.header().size(), kChunkHeaderBytes));
  }
  if (header->key != key) {
    return Invalid(absl::StrFormat("header.key %s does not match key %s", header->key.ToHex(), key.ToHex()));
  }
  const Hash128 fingerprint = FromProto(message.model_fingerprint());
  if (header->model_fingerprint != fingerprint) {
    return Invalid(absl::StrFormat("header.model_fingerprint %s does not match model_fingerprint %s",
                                   header->model_fingerprint.ToHex(), fingerprint.ToHex()));
  }
  const uint64_t size = kChunkHeaderBytes + header->payload_bytes;
  if (leases_->HeldByAnother(key, message.lease_id(), caller.name)) {
    metrics_.CountRejected("lease_held");
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        absl::StrFormat("key %s is leased to another caller: a put under it must carry that lease_id "
                                        "(lease_id %d does not match)",
                                        key.ToHex(), message.lease_id()));
  }
  if (store_->Locate(key)) {
    leases_->Published(key);
    response->set_already_stored(true);
    response->set_stored_bytes(size);
    return grpc::Status::OK;
  }
  auto writer = store_->BeginPut(size);
  if (!writer.ok()) return ToGrpcStatus(writer.status());
  absl::Status appended = (*writer)->Append(message.header());
  if (appended.ok()) appended = (*writer)->Append(message.data());
  while (appended.ok() && reader->Read(&message)) {
    watch.Progress();
    if (message.has_key() || !message.header().empty()) {
      return Invalid("key and header belong in the first message only");
    }
    appended = (*writer)->Append(message.data());
  }
  if (!appended.ok()) return ToGrpcStatus(appended);
  if (context->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "client cancelled the put");
  if (mac_ != nullptr && (*writer)->written() == size) {
    // With the fleet's key, forged or poisoned KV never gets stored (the workers would
    // refuse it anyway).
    const std::vector<std::string_view> payload = (*writer)->WrittenPieces(kChunkHeaderBytes, header->payload_bytes);
    std::string failed;
    if (absl::Status trusted = CheckTrusted(*header, payload, &failed); !trusted.ok()) {
      metrics_.CountRejected(failed);
      return ToGrpcStatus(trusted);
    }
  }
  auto already = store_->Commit(key, std::move(*writer));
  if (already.ok() && !*already) PromoteStored(key);
  if (!already.ok()) return ToGrpcStatus(already.status());
  leases_->Published(key);
  if (!*already) {
    metrics_.grpc_received.chunks->Increment();
    metrics_.grpc_received.bytes->Increment(static_cast<double>(size));
  }
  response->set_already_stored(*already);
  response->set_stored_bytes(size);
  return grpc::Status::OK;
}

grpc::Status KvCacheService::Lease(grpc::ServerContext* context, const v1::LeaseRequest* request,
                                   v1::LeaseResponse* response) {
  LatencyTimer timer(metrics_, "lease");
  auto caller = Authorize(context, Role::kWorker);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  if (!request->has_key()) return Invalid("key is required");
  auto ttl = request->ttl_ms() == 0 ? limits_.default_lease_ttl : std::chrono::milliseconds(request->ttl_ms());
  if (ttl > limits_.max_lease_ttl) {
    return Invalid(
        absl::StrFormat("ttl_ms %d exceeds max_lease_ttl=%dms", request->ttl_ms(), limits_.max_lease_ttl.count()));
  }
  auto wait = std::min(std::chrono::milliseconds(request->wait_ms()), limits_.max_lease_wait);
  const auto now = Clock::now();
  auto wait_until = now + wait;
  // Answer inside the caller's deadline: a HELD answer beats a DEADLINE_EXCEEDED.
  const auto deadline = context->deadline();
  const auto time_left = deadline - std::chrono::system_clock::now();
  if (time_left < std::chrono::hours(24 * 365)) wait_until = std::min(wait_until, now + time_left * 9 / 10);
  std::optional<StreamSlot> slot;
  if (wait.count() > 0) {
    slot.emplace(this, caller->name);
    if (!slot->taken()) return slot->Refusal();
  }
  const Hash128 key = FromProto(request->key());
  const LeaseTable::Result result = leases_->Acquire(key, request->holder(), caller->name, ttl, wait_until);
  switch (result.outcome) {
    case LeaseTable::Outcome::kGranted:
      response->set_outcome(v1::LeaseResponse::GRANTED);
      break;
    case LeaseTable::Outcome::kStored:
      response->set_outcome(v1::LeaseResponse::STORED);
      if (const auto where = store_->Locate(key)) response->set_tier(ToProtoTier(where->tier));
      return grpc::Status::OK;
    case LeaseTable::Outcome::kHeld:
      response->set_outcome(v1::LeaseResponse::HELD);
      break;
    case LeaseTable::Outcome::kShuttingDown:
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "cache server is shutting down");
  }
  response->set_lease_id(result.lease_id);
  response->set_expires_in_ms(static_cast<uint32_t>(std::max<int64_t>(0, result.remaining.count())));
  return grpc::Status::OK;
}

grpc::Status KvCacheService::ReleaseLease(grpc::ServerContext* context, const v1::ReleaseLeaseRequest* request,
                                          v1::ReleaseLeaseResponse*) {
  auto caller = Authorize(context, Role::kWorker);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  if (!request->has_key()) return Invalid("key is required");
  if (!leases_->Release(FromProto(request->key()), request->lease_id(), caller->name)) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrFormat("lease_id %d does not hold key %s (expired or published)", request->lease_id(),
                                        FromProto(request->key()).ToHex()));
  }
  return grpc::Status::OK;
}

absl::Status KvCacheService::CheckTrusted(const ChunkHeader& header, std::span<const std::string_view> payload,
                                          std::string* failed) const {
  if (mac_ != nullptr) {
    if (absl::Status s = mac_->Verify(header, payload); !s.ok()) {
      *failed = "bad_mac";
      return s;
    }
  }
  if (absl::Status s = CheckPayloadFinite(header.layout.dtype, payload); !s.ok()) {
    *failed = "non_finite";
    return absl::PermissionDeniedError(absl::StrCat("chunk refused: ", s.message()));
  }
  return absl::OkStatus();
}

grpc::Status KvCacheService::RenewLease(grpc::ServerContext* context, const v1::RenewLeaseRequest* request,
                                        v1::RenewLeaseResponse* response) {
  auto caller = Authorize(context, Role::kWorker);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  if (!request->has_key()) return Invalid("key is required");
  const auto ttl = request->ttl_ms() == 0 ? limits_.default_lease_ttl : std::chrono::milliseconds(request->ttl_ms());
  if (ttl > limits_.max_lease_ttl) {
    return Invalid(
        absl::StrFormat("ttl_ms %d exceeds max_lease_ttl=%dms", request->ttl_ms(), limits_.max_lease_ttl.count()));
  }
  if (!leases_->Renew(FromProto(request->key()), request->lease_id(), caller->name, ttl)) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrFormat("lease_id %d does not hold key %s (expired, released or published)",
                                        request->lease_id(), FromProto(request->key()).ToHex()));
  }
  response->set_expires_in_ms(static_cast<uint32_t>(ttl.count()));
  return grpc::Status::OK;
}

grpc::Status KvCacheService::ReportInvalid(grpc::ServerContext* context, const v1::ReportInvalidRequest* request,
                                           v1::ReportInvalidResponse* response) {
  if (auto caller = Authorize(context, Role::kWorker); !caller.ok()) return ToGrpcStatus(caller.status());
  if (!request->has_key()) return Invalid("key is required");
  if (request->header().size() != kChunkHeaderBytes) {
    return Invalid(
        absl::StrFormat("header: %d bytes, expected exactly %d", request->header().size(), kChunkHeaderBytes));
  }
  if (request->reason() != "mac" && request->reason() != "non_finite" && request->reason() != "checksum") {
    return Invalid(absl::StrFormat("reason '%s': expected mac, non_finite or checksum", request->reason()));
  }
  const Hash128 key = FromProto(request->key());
  // The GPU tier's copy of the reported version (a same-host worker read that one), judged
  // by its own bytes: checksum, values, and the MAC with the key.
  if (gpu_ != nullptr) {
    if (std::shared_ptr<const GpuValue> on_gpu = gpu_->Find(key); on_gpu && on_gpu->header() == request->header()) {
      absl::StatusOr<std::string> bytes = on_gpu->ReadAll();
      on_gpu.reset();
      bool good = false;
      if (bytes.ok()) {
        auto header = DecodeChunkHeader(std::string_view(*bytes).substr(0, kChunkHeaderBytes));
        const std::string_view payload = std::string_view(*bytes).substr(kChunkHeaderBytes);
        std::string failed;
        good = header.ok() && VerifyChunkPayload(*header, {&payload, 1}).ok() &&
               CheckTrusted(*header, {&payload, 1}, &failed).ok();
      }
      if (!good && gpu_->Delete(key)) {
        metrics_.CountReport("dropped");
        response->set_deleted(true);
      }
    }
  }
  auto read = store_->Read(key);  // checks the stored checksum: a corrupt value is dropped there
  if (!read.ok()) {
    if (request->reason() == "checksum" && read.status().code() == absl::StatusCode::kDataLoss) {
      metrics_.CountReport("dropped");
    }
    return grpc::Status::OK;  // gone already
  }
  if (request->reason() == "checksum") {  // the stored copy passed that read: the damage was in transit
    metrics_.CountReport("verified_good");
    return grpc::Status::OK;
  }
  const ChunkReader& reader = *read;
  std::string stored_header(kChunkHeaderBytes, '\0');
  if (reader.size() < kChunkHeaderBytes) return grpc::Status::OK;
  reader.Read(0, kChunkHeaderBytes, stored_header.data());
  if (stored_header != request->header()) {
    metrics_.CountReport("stale");  // another version is stored now
    return grpc::Status::OK;
  }
  // What this server can judge, it judges, so a report cannot delete a good chunk: the
  // values always, the MAC with the fleet's key. A MAC failure it cannot check is taken on
  // the authenticated worker's word.
  auto header = DecodeChunkHeader(stored_header);
  if (header.ok()) {
    const std::vector<std::string_view> payload = reader.Pieces(kChunkHeaderBytes, reader.size() - kChunkHeaderBytes);
    std::string failed;
    const bool passes = CheckTrusted(*header, payload, &failed).ok();
    const bool judged = mac_ != nullptr || request->reason() == "non_finite";
    if (passes && judged) {
      metrics_.CountReport("verified_good");
      return grpc::Status::OK;
    }
  }
  // Keys are content hashes, so another version appears under this key only if this one
  // is evicted and another worker publishes in between: the window is that of this call.
  const bool deleted = DeleteEverywhere(key);
  metrics_.CountReport(deleted ? "dropped" : "stale");
  response->set_deleted(deleted);
  return grpc::Status::OK;
}

grpc::Status KvCacheService::Delete(grpc::ServerContext* context, const v1::DeleteRequest* request,
                                    v1::DeleteResponse* response) {
  if (auto caller = Authorize(context, Role::kAdmin); !caller.ok()) return ToGrpcStatus(caller.status());
  if (request->keys_size() > limits_.max_lookup_keys) {
    return Invalid(
        absl::StrFormat("keys: %d keys exceed max_lookup_keys=%d", request->keys_size(), limits_.max_lookup_keys));
  }
  uint32_t deleted = 0;
  for (const v1::Hash128& key : request->keys()) deleted += DeleteEverywhere(FromProto(key)) ? 1 : 0;
  response->set_deleted(deleted);
  return grpc::Status::OK;
}

grpc::Status KvCacheService::Stats(grpc::ServerContext* context, const v1::StatsRequest*, v1::StatsResponse* response) {
  if (auto caller = Authorize(context, Role::kAdmin); !caller.ok()) return ToGrpcStatus(caller.status());
  const TieredStoreStats s = store_->stats();
  auto tier = [&](v1::Tier which, const TierMetrics& m, uint64_t capacity, uint64_t used, uint64_t entries) {
    v1::TierStats* t = response->add_tiers();
    t->set_tier(which);
    t->set_capacity_bytes(capacity);
    t->set_used_bytes(used);
    t->set_entries(entries);
    t->set_hits(static_cast<uint64_t>(m.hits->Value()));
    t->set_evictions(static_cast<uint64_t>(m.evictions->Value()));
  };
  if (gpu_ != nullptr) {
    const GpuTierStats g = gpu_->stats();
    tier(v1::TIER_GPU, metrics_.gpu, g.capacity, g.used, g.entries);
  }
  tier(v1::TIER_HOST, metrics_.host, s.host_capacity, s.host_used, s.host_entries);
  if (s.disk_capacity > 0) tier(v1::TIER_DISK, metrics_.disk, s.disk_capacity, s.disk_used, s.disk_entries);
  response->set_lookups(static_cast<uint64_t>(metrics_.lookups->Value()));
  response->set_misses(static_cast<uint64_t>(metrics_.misses->Value()));
  response->set_lease_grants(static_cast<uint64_t>(metrics_.lease_grants->Value()));
  response->set_lease_waits(static_cast<uint64_t>(metrics_.lease_waits->Value()));
  response->set_lease_expiries(static_cast<uint64_t>(metrics_.lease_expiries->Value()));
  response->set_corrupt_values(static_cast<uint64_t>(metrics_.host.corrupt->Value() + metrics_.disk.corrupt->Value()));
  response->set_demotions(static_cast<uint64_t>(metrics_.demotions->Value()));
  response->set_promotions(static_cast<uint64_t>(metrics_.promotions->Value()));
  response->set_pending_disk_writes(s.pending_disk_writes);
  response->set_grpc_bytes_sent(static_cast<uint64_t>(metrics_.grpc_sent.bytes->Value()));
  response->set_shm_bytes_sent(static_cast<uint64_t>(metrics_.shm_sent.bytes->Value()));
  if (peers_ != nullptr) {
    const PeerLinkTotals peers = peers_->totals();
    response->set_peer_sessions(peers.sessions);
    response->set_peer_bytes_sent(peers.bytes_sent);
    response->set_peer_transfers_failed(peers.failed);
  }
  if (shm_ != nullptr) {
    const ShmLeaseTable::Totals shm = shm_->totals();
    response->set_shm_sessions(shm.sessions);
    response->set_shm_leases(shm.leases);
    response->set_shm_leased_bytes(shm.bytes);
    response->set_shm_reservations(shm.reservations);
    response->set_shm_orphaned_sessions(shm.orphaned_sessions);
    response->set_shm_bytes_received(static_cast<uint64_t>(metrics_.shm_received.bytes->Value()));
    if (store_->arena().shared()) response->set_shm_arena_bytes(store_->arena().capacity_bytes());
  }
  return grpc::Status::OK;
}

}  // namespace lazykv::cache
