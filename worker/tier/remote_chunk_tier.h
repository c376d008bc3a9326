// The cache servers as one tier: the owner of a key among N servers by rendezvous
// hashing, lookups batched per owner, deadlines on every call and bounded retries. A
// server that fails is marked down with exponential backoff: its keys are misses (the
// worker computes them) until a later call finds it back.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "proto/kvcache.grpc.pb.h"
#include "worker/tier/chunk_tier.h"

namespace lazykv {

struct RemoteTierOptions {
  std::vector<std::string> servers;  // HOST:PORT each
  std::string holder;                // this worker's name, in lease logs
  std::chrono::milliseconds lookup_deadline{2000};
  std::chrono::milliseconds transfer_deadline{60000};
  int max_retries = 2;  // per call, on transient errors
  std::chrono::milliseconds retry_delay{50};
  std::chrono::milliseconds initial_backoff{250};  // a failed server is skipped this long, doubling
  std::chrono::milliseconds max_backoff{5000};
  uint32_t slice_bytes = 4 << 20;
};

// "host:1,host:2" → servers; INVALID_ARGUMENT naming the bad entry.
absl::StatusOr<std::vector<std::string>> ParseServerList(std::string_view list);

// Thread-safe, as every ChunkTier: gRPC stubs are, and each server's health is guarded.
class RemoteChunkTier final : public ChunkTier {
 public:
  static absl::StatusOr<std::unique_ptr<RemoteChunkTier>> Create(RemoteTierOptions options);

  std::vector<std::optional<TierHit>> Lookup(std::span<const Hash128> keys) override;
  absl::StatusOr<FetchedChunk> Fetch(const Hash128& key) override;
  LeaseAnswer Lease(const Hash128& key, std::chrono::milliseconds ttl, std::chrono::milliseconds wait) override;
  void ReleaseLease(const Hash128& key, uint64_t lease_id) override;
  absl::Status Publish(const Hash128& key, const Hash128& model_fingerprint, std::string_view stored,
                       uint64_t lease_id) override;
  std::string Describe() const override;

  // Index of the server owning `key` (in options().servers).
  size_t OwnerOf(const Hash128& key) const;

 private:
  struct Server {
    std::string address;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<v1::KvCache::Stub> stub;
    Mutex mu;
    std::chrono::steady_clock::time_point down_until ABSL_GUARDED_BY(mu){};
    std::chrono::milliseconds backoff ABSL_GUARDED_BY(mu){0};
  };
  explicit RemoteChunkTier(RemoteTierOptions options);
  bool Available(Server& server);
  void Succeeded(Server& server);
  void Failed(Server& server, const grpc::Status& status, std::string_view call);
  // Runs `call` (a fresh context each try) with retries on transient errors.
  template <typename Call>
  grpc::Status WithRetries(Server& server, std::chrono::milliseconds deadline, std::string_view name, Call call);

  RemoteTierOptions options_;
  std::vector<std::unique_ptr<Server>> servers_;
};

}  // namespace lazykv
