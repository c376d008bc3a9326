// Chunks across GPUs in the KvCache service (DESIGN.md section 5): PeerLinkSession opens a
// point-to-point link (NCCL; its socket twin for an emulated GPU tier) between this
// server's GPU tier and a worker's GPU and holds it as long as the worker's stream, and
// PeerGet sends a chunk's payload from the tier's pages over it, holding the pages until
// the transfer ends.
#include <spdlog/spdlog.h>

#include "absl/strings/str_format.h"
#include "cache_server/kv_cache_service.h"
#include "common/chunk_codec.h"
#include "common/grpc_util.h"

namespace lazykv::cache {

grpc::Status KvCacheService::PeerLinkSession(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<v1::PeerLinkSessionResponse, v1::PeerLinkSessionRequest>* stream) {
  auto caller = Authorize(context, Role::kWorker);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  if (peers_ == nullptr || gpu_ == nullptr) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "this server has no GPU tier with peer links (--gpu-capacity): use ShmGet or Get");
  }
  v1::PeerLinkSessionRequest request;
  if (!stream->Read(&request)) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "empty peer link session");
  if (request.kind().empty()) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "kind is required");
  auto opened = peers_->Open(request.kind(), caller->name, [context] { context->TryCancel(); });
  if (!opened.ok()) {
    if (opened.status().code() == absl::StatusCode::kResourceExhausted) metrics_.CountRejected("peer_session_limit");
    return ToGrpcStatus(opened.status());
  }
  const uint64_t id = opened->session_id;
  v1::PeerLinkSessionResponse answer;
  answer.set_session_id(id);
  answer.set_kind(request.kind());
  answer.set_link_id(opened->link_id);
  answer.set_join_timeout_ms(static_cast<uint32_t>(peers_->limits().join_timeout.count()));
  if (!stream->Write(answer)) {
    peers_->Close(id);
    return grpc::Status::OK;  // the worker went away
  }
  if (absl::Status joined = peers_->Join(id); !joined.ok()) {
    peers_->Close(id);
    spdlog::warn("peer link session {:016x} of {} ({}): the link did not come up: {}", id, caller->name,
                 request.holder(), std::string(joined.message()));
    return ToGrpcStatus(joined);
  }
  spdlog::info("peer link session {:016x} opened by {} ({}, {})", id, caller->name, request.holder(), request.kind());
  // Until the worker closes the stream or its connection drops (exit, kill -9); nothing
  // more is expected on it.
  while (stream->Read(&request)) {
  }
  peers_->Close(id);
  spdlog::info("peer link session {:016x} of {} ended", id, caller->name);
  return grpc::Status::OK;
}

grpc::Status KvCacheService::PeerGet(grpc::ServerContext* context, const v1::PeerGetRequest* request,
                                     v1::PeerGetResponse* response) {
  auto caller = Authorize(context, Role::kWorker);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  if (peers_ == nullptr || gpu_ == nullptr) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "this server has no peer links: use ShmGet or Get");
  }
  if (request->session_id() == 0) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "session_id is required (PeerLinkSession's answer)");
  }
  if (!request->has_key()) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "key is required");
  std::shared_ptr<const GpuValue> value = gpu_->Find(FromProto(request->key()));
  if (value == nullptr) {
    response->set_found(false);  // nothing sent: the worker fetches it another way
    return grpc::Status::OK;
  }
  const uint64_t payload = value->size() - kChunkHeaderBytes;
  if (request->max_payload_bytes() > 0 && payload > request->max_payload_bytes()) {
    response->set_found(false);  // larger than the worker's buffer: it grows it for the next
    response->set_stored_bytes(value->size());
    return grpc::Status::OK;
  }
  auto pieces = gpu_->arena().Pieces(value->pages(), kChunkHeaderBytes, payload);
  if (!pieces.ok()) return ToGrpcStatus(absl::InternalError(std::string(pieces.status().message())));
  response->add_segments(payload);  // one transfer: the link gathers the pages (peer_link.h)
  absl::Status sent = peers_->Send(request->session_id(), caller->name, *std::move(pieces), value);
  if (!sent.ok()) return ToGrpcStatus(sent);
  response->set_found(true);
  *response->mutable_header() = value->header();
  response->set_stored_bytes(value->size());
  CacheMetrics::Transport& counters = peers_->kind() == std::string_view("nccl") ? metrics_.nccl_sent : metrics_.socket_sent;
  counters.chunks->Increment();
  counters.bytes->Increment(static_cast<double>(payload));
  return grpc::Status::OK;
}

}  // namespace lazykv::cache
