// The GPU tier in the KvCache service (DESIGN.md section 5): what enters it (promotions
// from reads and publications), reading its copy back, dropping it, and its same-host read:
// GpuGet hands a worker on this host the pages of a chunk in the GPU tier's device memory
// (which its session opened once through the arena's CUDA IPC handle) under a read lease,
// instead of its bytes.
#include "absl/strings/str_format.h"
#include "cache_server/kv_cache_service.h"
#include "common/grpc_util.h"

namespace lazykv::cache {

void KvCacheService::Promote(const Hash128& key, const ChunkReader& read) {
  if (gpu_ == nullptr || !gpu_->WouldQueue(key, read.size())) return;
  if (read.host_value() != nullptr) {
    gpu_->RequestPromotion(key, read);
  } else if (std::shared_ptr<const HostValue> value = store_->HostCopy(key)) {
    gpu_->RequestPromotion(key, ChunkReader(StoreTier::kHost, std::move(value)));
  }
}

void KvCacheService::PromoteStored(const Hash128& key) {
  if (gpu_ == nullptr) return;
  std::shared_ptr<const HostValue> value = store_->HostCopy(key);
  if (value != nullptr && gpu_->HasRoomFor(value->size())) {
    gpu_->RequestPromotion(key, ChunkReader(StoreTier::kHost, std::move(value)));
  }
}

absl::StatusOr<std::string> KvCacheService::ReadGpuCopy(const Hash128& key) {
  std::shared_ptr<const GpuValue> value = gpu_ != nullptr ? gpu_->Find(key) : nullptr;
  if (value == nullptr) return absl::NotFoundError("not stored");
  return value->ReadAll();
}

bool KvCacheService::DeleteEverywhere(const Hash128& key) {
  const bool from_gpu = gpu_ != nullptr && gpu_->Delete(key);
  return store_->Delete(key) || from_gpu;
}

absl::Status KvCacheService::LeaseGpuCopy(uint64_t session_id, const std::string& caller, const Hash128& key,
                                          double share, v1::ShmGetResponse* answer, uint64_t lookup_id) {
  std::shared_ptr<const GpuValue> value = gpu_ != nullptr ? gpu_->Find(key) : nullptr;
  if (value == nullptr) return absl::NotFoundError(absl::StrFormat("chunk %s is not in the GPU tier", key.ToHex()));
  const uint64_t size = value->size();
  const std::span<const uint32_t> value_pages = value->pages();
  auto lease = shm_->Acquire(session_id, caller, std::shared_ptr<const void>(value), size, share, lookup_id);
  if (!lease.ok()) {
    if (lease.status().code() == absl::StatusCode::kResourceExhausted && share == 1.0) {
      metrics_.CountRejected("shm_lease_limit");
    }
    return lease.status();
  }
  answer->set_lease_id(*lease);
  answer->set_tier(v1::TIER_GPU);
  answer->set_stored_bytes(size);
  answer->set_header(value->header());
  answer->mutable_pages()->Assign(value_pages.begin(), value_pages.end());
  metrics_.cuda_ipc_sent.chunks->Increment();
  metrics_.cuda_ipc_sent.bytes->Increment(static_cast<double>(size));
  return absl::OkStatus();
}

grpc::Status KvCacheService::GpuGet(grpc::ServerContext* context, const v1::GpuGetRequest* request,
                                    v1::GpuGetResponse* response) {
  auto caller = Authorize(context, Role::kWorker);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  if (gpu_ == nullptr || shm_ == nullptr) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "this server has no GPU tier with a same-host transport: use ShmGet or Get");
  }
  if (!request->has_key()) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "key is required");
  const Hash128 key = FromProto(request->key());
  v1::ShmGetResponse answer;
  absl::Status leased = LeaseGpuCopy(request->session_id(), caller->name, key, /*share=*/1.0, &answer);
  if (leased.code() == absl::StatusCode::kNotFound) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrFormat("chunk %s is not in the GPU tier: use ShmGet or Get", key.ToHex()));
  }
  if (!leased.ok()) return ToGrpcStatus(leased);
  response->set_lease_id(answer.lease_id());
  response->set_stored_bytes(answer.stored_bytes());
  *response->mutable_header() = std::move(*answer.mutable_header());
  *response->mutable_pages() = std::move(*answer.mutable_pages());
  return grpc::Status::OK;
}

}  // namespace lazykv::cache
