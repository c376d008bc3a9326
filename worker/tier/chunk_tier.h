// The worker's view of the cache tier (DESIGN.md section 4): where chunk KV lives
// outside the local pool. Two implementations: the cache servers over gRPC
// (remote_chunk_tier.h) and the same store embedded in the process
// (embedded_chunk_tier.h). A tier that cannot answer reports a miss, never an error:
// the worker computes the chunk instead.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/chunk_key.h"

namespace lazykv {

// Where a request's chunk tokens came from (usage and metrics).
enum class ChunkSource { kPool, kHost, kDisk, kComputed };

struct TierHit {
  ChunkSource source = ChunkSource::kHost;
  uint64_t stored_bytes = 0;
};

struct FetchedChunk {
  std::string stored;  // header + payload (common/chunk_codec.h)
  ChunkSource source = ChunkSource::kHost;
};

struct LeaseAnswer {
  enum class State { kGranted, kStored, kHeld, kUnavailable };
  State state = State::kUnavailable;
  uint64_t lease_id = 0;
  std::chrono::milliseconds remaining{0};
};

// Implementations are thread-safe: the resolver calls every method from several threads
// at once (lookups, fetches and lease waits of different chunks, and its publisher).
class ChunkTier {
 public:
  virtual ~ChunkTier() = default;
  // One answer per key (nullopt: a miss, or its server is unreachable).
  virtual std::vector<std::optional<TierHit>> Lookup(std::span<const Hash128> keys) = 0;
  // The stored chunk; any error means "compute it".
  virtual absl::StatusOr<FetchedChunk> Fetch(const Hash128& key) = 0;
  // Single flight: granted (compute and publish), stored (fetch), held by another (after
  // waiting up to `wait`), or unavailable (compute without a lease).
  virtual LeaseAnswer Lease(const Hash128& key, std::chrono::milliseconds ttl, std::chrono::milliseconds wait) = 0;
  virtual void ReleaseLease(const Hash128& key, uint64_t lease_id) = 0;
  virtual absl::Status Publish(const Hash128& key, const Hash128& model_fingerprint, const std::string& stored,
                               uint64_t lease_id) = 0;
  virtual std::string Describe() const = 0;
};

}  // namespace lazykv
