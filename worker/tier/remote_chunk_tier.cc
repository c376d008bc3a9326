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

namespace lazykv {
namespace {

using Clock = std::chrono::steady_clock;

bool Transient(grpc::StatusCode code) {
  return code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::DEADLINE_EXCEEDED ||
         code == grpc::StatusCode::ABORTED || code == grpc::StatusCode::RESOURCE_EXHAUSTED;
}

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
  for (const std::string& address : options_.servers) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(static_cast<int>(options_.slice_bytes + (1 << 20)));
    args.SetMaxSendMessageSize(static_cast<int>(options_.slice_bytes + (1 << 20)));
    args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 8 << 20);  // MiB-sized chunks
    // Notice a restarted server within about a second.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    auto server = std::make_unique<Server>();
    server->address = address;
    server->channel = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
    server->stub = v1::KvCache::NewStub(server->channel);
    servers_.push_back(std::move(server));
  }
}

size_t RemoteChunkTier::OwnerOf(const Hash128& key) const { return RendezvousOwner(key, options_.servers); }

bool RemoteChunkTier::Available(Server& server) {
  MutexLock lock(&server.mu);
  return Clock::now() >= server.down_until;
}

void RemoteChunkTier::Succeeded(Server& server) {
  MutexLock lock(&server.mu);
  if (server.backoff.count() > 0) spdlog::info("cache server {} is back", server.address);
  server.backoff = std::chrono::milliseconds(0);
}

void RemoteChunkTier::Failed(Server& server, const grpc::Status& status, std::string_view call) {
  MutexLock lock(&server.mu);
  server.backoff =
      server.backoff.count() == 0 ? options_.initial_backoff : std::min(server.backoff * 2, options_.max_backoff);
  server.down_until = Clock::now() + server.backoff;
  spdlog::warn("cache server {} failed {} ({}: {}); its keys are misses for {} ms", server.address, std::string(call),
               static_cast<int>(status.error_code()), status.error_message(), server.backoff.count());
}

template <typename Call>
grpc::Status RemoteChunkTier::WithRetries(Server& server, std::chrono::milliseconds deadline, std::string_view name,
                                          Call call) {
  grpc::Status status;
  for (int attempt = 0; attempt <= options_.max_retries; ++attempt) {
    if (attempt > 0) std::this_thread::sleep_for(options_.retry_delay * attempt);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + deadline);
    status = call(context);
    if (status.ok()) {
      Succeeded(server);
      return status;
    }
    if (!Transient(status.error_code())) return status;
  }
  Failed(server, status, name);
  return status;
}

std::vector<std::optional<TierHit>> RemoteChunkTier::Lookup(std::span<const Hash128> keys) {
  std::vector<std::optional<TierHit>> out(keys.size());
  std::vector<std::vector<size_t>> by_owner(servers_.size());
  for (size_t i = 0; i < keys.size(); ++i) by_owner[OwnerOf(keys[i])].push_back(i);
  for (size_t s = 0; s < servers_.size(); ++s) {
    if (by_owner[s].empty() || !Available(*servers_[s])) continue;
    v1::LookupRequest request;
    for (size_t i : by_owner[s]) *request.add_keys() = ToProto(keys[i]);
    v1::LookupResponse response;
    const grpc::Status status = WithRetries(
        *servers_[s], options_.lookup_deadline, "lookup",
        [&](grpc::ClientContext& context) { return servers_[s]->stub->Lookup(&context, request, &response); });
    if (!status.ok() || response.results_size() != static_cast<int>(by_owner[s].size())) continue;
    for (size_t j = 0; j < by_owner[s].size(); ++j) {
      const v1::LookupResult& r = response.results(static_cast<int>(j));
      if (r.found()) out[by_owner[s][j]] = TierHit{ChunkSource::kRemote, r.stored_bytes(), servers_[s]->address};
    }
  }
  return out;
}

absl::StatusOr<FetchedChunk> RemoteChunkTier::Fetch(const Hash128& key) {
  Server& server = *servers_[OwnerOf(key)];
  if (!Available(server)) return absl::UnavailableError(absl::StrFormat("cache server %s is down", server.address));
  v1::GetRequest request;
  *request.mutable_key() = ToProto(key);
  std::string stored;
  const grpc::Status status = WithRetries(server, options_.transfer_deadline, "get", [&](grpc::ClientContext& context) {
    stored.clear();
    v1::Tier tier = v1::TIER_UNSPECIFIED;
    return GetChunkInto(server.channel.get(), &context, request, &stored, &tier);
  });
  if (!status.ok()) return FromGrpcStatus(status);
  return FetchedChunk{ChunkBytes::FromString(std::move(stored)), ChunkSource::kRemote, server.address};
}

LeaseAnswer RemoteChunkTier::Lease(const Hash128& key, std::chrono::milliseconds ttl, std::chrono::milliseconds wait) {
  Server& server = *servers_[OwnerOf(key)];
  if (!Available(server)) return {LeaseAnswer::State::kUnavailable};
  v1::LeaseRequest request;
  *request.mutable_key() = ToProto(key);
  request.set_holder(options_.holder);
  request.set_ttl_ms(static_cast<uint32_t>(ttl.count()));
  request.set_wait_ms(static_cast<uint32_t>(wait.count()));
  v1::LeaseResponse response;
  const grpc::Status status =
      WithRetries(server, options_.lookup_deadline + wait, "lease",
                  [&](grpc::ClientContext& context) { return server.stub->Lease(&context, request, &response); });
  if (!status.ok()) return {LeaseAnswer::State::kUnavailable};
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
  v1::ReleaseLeaseRequest request;
  *request.mutable_key() = ToProto(key);
  request.set_lease_id(lease_id);
  v1::ReleaseLeaseResponse response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + options_.lookup_deadline);
  (void)server.stub->ReleaseLease(&context, request, &response);  // an expired lease needs no release
}

absl::Status RemoteChunkTier::Publish(const Hash128& key, const Hash128& model_fingerprint, std::string_view stored,
                                      uint64_t lease_id) {
  Server& server = *servers_[OwnerOf(key)];
  if (!Available(server)) return absl::UnavailableError(absl::StrFormat("cache server %s is down", server.address));
  if (stored.size() < kChunkHeaderBytes) return absl::InvalidArgumentError("publish: chunk shorter than its header");
  const std::string_view bytes(stored);
  const grpc::Status status = WithRetries(server, options_.transfer_deadline, "put", [&](grpc::ClientContext& context) {
    v1::PutResponse response;
    return PutChunkSlices(*server.stub, &context, ToProto(key), ToProto(model_fingerprint), lease_id,
                          bytes.substr(0, kChunkHeaderBytes), bytes.substr(kChunkHeaderBytes), options_.slice_bytes,
                          &response);
  });
  return FromGrpcStatus(status);
}

std::string RemoteChunkTier::Describe() const {
  return absl::StrFormat("cache servers %s", absl::StrJoin(options_.servers, ","));
}

}  // namespace lazykv
