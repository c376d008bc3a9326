// The same-host transport of the KvCache service (DESIGN.md section 5): ShmSession and
// ShmGet. A worker on this host maps the shared host arena read-only and reads a chunk's
// pages in place under a read lease (shm_lease_table.h), instead of receiving its bytes
// over a gRPC stream.
#include <spdlog/spdlog.h>
#include <unistd.h>

#include "absl/strings/str_format.h"
#include "cache_server/kv_cache_service.h"
#include "common/grpc_util.h"
#include "common/shm_host_id.h"

namespace lazykv::cache {

grpc::Status KvCacheService::ShmSession(
    grpc::ServerContext* context, grpc::ServerReaderWriter<v1::ShmSessionResponse, v1::ShmSessionRequest>* stream) {
  auto caller = Authorize(context, Role::kWorker);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  if (shm_ == nullptr || !store_->arena().shared()) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "this server's host arena is not shared: use Get");
  }
  v1::ShmSessionRequest request;
  if (!stream->Read(&request)) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "empty shm session");
  auto session = shm_->OpenSession(
      caller->name, [context] { context->TryCancel(); }, request.holder_pid());
  if (!session.ok()) {
    if (session.status().code() == absl::StatusCode::kResourceExhausted) metrics_.CountRejected("shm_session_limit");
    return ToGrpcStatus(session.status());
  }
  const HostArena& arena = store_->arena();
  v1::ShmSessionResponse opened;
  opened.set_session_id(*session);
  opened.set_server_pid(static_cast<int32_t>(getpid()));
  opened.set_arena_fd(arena.fd());
  opened.set_arena_bytes(arena.capacity_bytes());
  opened.set_page_bytes(arena.page_bytes());
  opened.set_arena_dev(arena.file_dev());
  opened.set_arena_ino(arena.file_ino());
  opened.set_max_leases(shm_->limits().max_leases_per_session);
  opened.set_max_lease_bytes(shm_->limits().max_bytes_per_session);
  opened.set_boot_id(HostBootId());
  if (gpu_ != nullptr) {
    const DeviceArena& device = gpu_->arena();
    opened.set_gpu_ipc_handle(device.ipc_handle());
    opened.set_gpu_device_uuid(device.device_uuid());
    opened.set_gpu_arena_bytes(device.capacity_bytes());
    opened.set_gpu_page_bytes(device.page_bytes());
  }
  spdlog::info("shm session {:016x} opened by {} ({}, pid {})", *session, caller->name, request.holder(),
               request.holder_pid());
  uint64_t released = 0;
  if (stream->Write(opened)) {
    // Until the worker closes the stream or its connection drops (exit, kill -9): the
    // kernel closes its socket, and gRPC ends this Read.
    while (stream->Read(&request)) {
      for (uint64_t lease : request.release()) released += shm_->Release(*session, lease) ? 1 : 0;
      for (uint64_t reservation : request.abandon()) shm_->Abandon(*session, reservation);
      for (uint64_t lookup : request.release_lookup()) released += shm_->ReleaseLookup(*session, lookup);
    }
  }
  const uint64_t held = shm_->totals().leases;
  shm_->CloseSession(*session);
  spdlog::info(
      "shm session {:016x} of {} ended ({} leases released by the worker; {} leases held server-wide before "
      "its own were dropped)",
      *session, caller->name, released, held);
  return grpc::Status::OK;
}

absl::Status KvCacheService::LeaseHostCopy(uint64_t session_id, const std::string& caller, const Hash128& key,
                                           const ChunkReader& read, double share, v1::ShmGetResponse* answer,
                                           uint64_t lookup_id) {
  std::shared_ptr<const HostValue> value = read.host_value();
  if (value == nullptr) value = store_->HostCopy(key);  // promoted by this read
  if (value == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrFormat("chunk %s is on disk only (no room in host RAM now): use Get", key.ToHex()));
  }
  const uint64_t size = value->size();
  const std::span<const uint32_t> pages = value->pages();
  // `value` is held here too: a session ending at once would otherwise drop it under us.
  auto lease = shm_->Acquire(session_id, caller, value, size, share, lookup_id);
  if (!lease.ok()) {
    if (lease.status().code() == absl::StatusCode::kResourceExhausted && share == 1.0) {
      metrics_.CountRejected("shm_lease_limit");
    }
    return lease.status();
  }
  answer->set_lease_id(*lease);
  answer->set_tier(ToProtoTier(read.tier()));
  answer->set_stored_bytes(size);
  answer->mutable_pages()->Assign(pages.begin(), pages.end());
  metrics_.shm_sent.chunks->Increment();
  metrics_.shm_sent.bytes->Increment(static_cast<double>(size));
  return absl::OkStatus();
}

grpc::Status KvCacheService::ShmGet(grpc::ServerContext* context, const v1::ShmGetRequest* request,
                                    v1::ShmGetResponse* response) {
  auto caller = Authorize(context, Role::kWorker);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  if (shm_ == nullptr || !store_->arena().shared()) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "this server's host arena is not shared: use Get");
  }
  if (!request->has_key()) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "key is required");
  const Hash128 key = FromProto(request->key());
  if (request->prefer_gpu() && gpu_ != nullptr) {  // device to device, when the GPU tier has it
    absl::Status leased = LeaseGpuCopy(request->session_id(), caller->name, key, /*share=*/1.0, response);
    if (leased.ok()) return grpc::Status::OK;
    if (leased.code() != absl::StatusCode::kNotFound) return ToGrpcStatus(leased);
  }
  // The worker checks the payload's checksum itself, so only header and key are checked here
  // (a chunk read from disk is checked in full, and promoted to host RAM).
  auto read = store_->Read(key, PayloadCheck::kHeaderOnly);
  if (read.status().code() == absl::StatusCode::kNotFound) {
    // Only the GPU tier holds it (host RAM evicted it since its promotion) and this worker
    // cannot read it there: demoted now, then read from host RAM as usual.
    absl::StatusOr<std::string> bytes = ReadGpuCopy(key);
    if (bytes.ok() && store_->Put(key, *bytes).ok()) read = store_->Read(key, PayloadCheck::kHeaderOnly);
  }
  if (!read.ok()) return ToGrpcStatus(read.status());
  Promote(key, *read);
  return ToGrpcStatus(LeaseHostCopy(request->session_id(), caller->name, key, *read, /*share=*/1.0, response));
}

void KvCacheService::LeaseForLookup(uint64_t session_id, uint64_t lookup_id, const std::string& caller,
                                    const Hash128& key, bool prefer_gpu, const std::optional<ChunkLocation>& where,
                                    v1::LookupResult* result) {
  // Half of every bound: a worker's fetches (ShmGet) always find room beside what its
  // lookups leased ahead.
  constexpr double kLookupShare = 0.5;
  if (shm_ == nullptr || !store_->arena().shared()) return;
  v1::ShmGetResponse answer;
  if (prefer_gpu && gpu_ != nullptr && LeaseGpuCopy(session_id, caller, key, kLookupShare, &answer, lookup_id).ok()) {
    *result->mutable_lease() = std::move(answer);
    return;
  }
  // Host RAM only: a lookup does not wait on the disk (a chunk demoted between this check and
  // the read is the exception: read back, as ShmGet would).
  if (!where || where->tier != StoreTier::kHost || store_->HostCopy(key) == nullptr) return;
  // Read, as ShmGet reads: the request wants the chunk, so the eviction policy counts the
  // access and the GPU tier may promote it, whether the worker then fetches it or not.
  auto read = store_->Read(key, PayloadCheck::kHeaderOnly);
  if (!read.ok() || read->tier() != StoreTier::kHost) return;
  Promote(key, *read);
  answer.Clear();
  if (LeaseHostCopy(session_id, caller, key, *read, kLookupShare, &answer, lookup_id).ok()) {
    *result->mutable_lease() = std::move(answer);
  }
}

namespace {

grpc::Status Refused(grpc::StatusCode code, const std::string& message) { return grpc::Status(code, message); }

}  // namespace

grpc::Status KvCacheService::ShmReserve(grpc::ServerContext* context, const v1::ShmReserveRequest* request,
                                        v1::ShmReserveResponse* response) {
  auto caller = Authorize(context, Role::kWorker);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  if (shm_ == nullptr || !store_->arena().shared()) {
    return Refused(grpc::StatusCode::FAILED_PRECONDITION, "this server's host arena is not shared: use Put");
  }
  if (!request->has_key() || !request->has_model_fingerprint()) {
    return Refused(grpc::StatusCode::INVALID_ARGUMENT, "key and model_fingerprint are required");
  }
  const uint64_t size = request->stored_bytes();
  if (size < kChunkHeaderBytes) {
    return Refused(grpc::StatusCode::INVALID_ARGUMENT,
                   absl::StrFormat("stored_bytes %d is shorter than the %d-byte header", size, kChunkHeaderBytes));
  }
  const Hash128 key = FromProto(request->key());
  if (leases_->HeldByAnother(key, request->lease_id(), caller->name)) {
    metrics_.CountRejected("lease_held");
    return Refused(grpc::StatusCode::PERMISSION_DENIED,
                   absl::StrFormat("key %s is leased to another caller (lease_id %d does not match)", key.ToHex(),
                                   request->lease_id()));
  }
  if (store_->Locate(key)) {
    leases_->Published(key);
    response->set_already_stored(true);
    return grpc::Status::OK;
  }
  if (store_->arena().PagesFor(size) > store_->arena().num_pages()) {
    return Refused(grpc::StatusCode::RESOURCE_EXHAUSTED,
                   absl::StrFormat("chunk of %d bytes is larger than host RAM: use Put", size));
  }
  auto writer = store_->BeginPut(size);  // may wait for room, up to the store's space_wait
  if (!writer.ok()) return ToGrpcStatus(writer.status());
  if ((*writer)->direct_to_disk()) return Refused(grpc::StatusCode::RESOURCE_EXHAUSTED, "not in host RAM: use Put");
  const std::span<const uint32_t> pages = (*writer)->host_pages();
  response->mutable_pages()->Assign(pages.begin(), pages.end());  // before the writer moves
  auto reserved = shm_->Reserve(request->session_id(), caller->name,
                                ShmLeaseTable::Reservation{.key = key,
                                                           .model_fingerprint = FromProto(request->model_fingerprint()),
                                                           .lease_id = request->lease_id(),
                                                           .writer = *std::move(writer)});
  if (!reserved.ok()) {
    if (reserved.status().code() == absl::StatusCode::kResourceExhausted) metrics_.CountRejected("shm_lease_limit");
    response->clear_pages();
    return ToGrpcStatus(reserved.status());
  }
  response->set_reservation_id(*reserved);
  return grpc::Status::OK;
}

grpc::Status KvCacheService::ShmCommit(grpc::ServerContext* context, const v1::ShmCommitRequest* request,
                                       v1::ShmCommitResponse* response) {
  auto caller = Authorize(context, Role::kWorker);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  if (shm_ == nullptr) {
    return Refused(grpc::StatusCode::FAILED_PRECONDITION, "this server's host arena is not shared: use Put");
  }
  auto reservation = shm_->TakeReservation(request->session_id(), caller->name, request->reservation_id());
  if (!reservation.ok()) return ToGrpcStatus(reservation.status());
  const Hash128& key = reservation->key;
  std::unique_ptr<ChunkWriter> writer = std::move(reservation->writer);
  (void)writer->WritablePieces();  // the worker wrote every byte in place
  const uint64_t size = writer->size();
  std::string header_bytes;
  for (std::string_view piece : writer->WrittenPieces(0, kChunkHeaderBytes)) header_bytes.append(piece);
  // The checks of a Put, on the bytes as they rest in the pages.
  auto header = DecodeChunkHeader(header_bytes);
  if (!header.ok()) {
    return Refused(static_cast<grpc::StatusCode>(header.status().code()),
                   absl::StrFormat("header: %s", std::string(header.status().message())));
  }
  if (header->key != key) {
    return Refused(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrFormat("header.key %s does not match the reserved key %s", header->key.ToHex(), key.ToHex()));
  }
  if (header->model_fingerprint != reservation->model_fingerprint) {
    return Refused(grpc::StatusCode::INVALID_ARGUMENT, "header.model_fingerprint does not match the reservation's");
  }
  if (kChunkHeaderBytes + header->payload_bytes != size) {
    return Refused(grpc::StatusCode::INVALID_ARGUMENT,
                   absl::StrFormat("header announces %d payload bytes; %d were reserved", header->payload_bytes,
                                   size - kChunkHeaderBytes));
  }
  if (leases_->HeldByAnother(key, reservation->lease_id, caller->name)) {
    metrics_.CountRejected("lease_held");
    return Refused(grpc::StatusCode::PERMISSION_DENIED,
                   absl::StrFormat("key %s is leased to another caller", key.ToHex()));
  }
  if (mac_ != nullptr) {
    const std::vector<std::string_view> payload = writer->WrittenPieces(kChunkHeaderBytes, header->payload_bytes);
    std::string failed;
    if (absl::Status trusted = CheckTrusted(*header, payload, &failed); !trusted.ok()) {
      metrics_.CountRejected(failed);
      return ToGrpcStatus(trusted);
    }
  }
  auto already = store_->Commit(key, std::move(writer));  // checks the checksum
  if (already.ok() && !*already) PromoteStored(key);
  if (!already.ok()) return ToGrpcStatus(already.status());
  leases_->Published(key);
  if (!*already) {
    metrics_.shm_received.chunks->Increment();
    metrics_.shm_received.bytes->Increment(static_cast<double>(size));
  }
  response->set_already_stored(*already);
  response->set_stored_bytes(size);
  return grpc::Status::OK;
}

}  // namespace lazykv::cache
