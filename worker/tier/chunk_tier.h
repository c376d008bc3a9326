// The worker's view of the cache tier (DESIGN.md section 4): where chunk KV lives
// outside the local pool. Two implementations: the cache servers over gRPC
// (remote_chunk_tier.h) and the same store embedded in the process
// (embedded_chunk_tier.h). A tier that cannot answer reports a miss, never an error:
// the worker computes the chunk instead.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/chunk_bytes.h"
#include "common/chunk_key.h"

namespace lazykv {

// Where a request's chunk tokens came from (usage and metrics): the local KV pool, the
// embedded tier's host RAM or disk, a cache server, or computed by this worker.
enum class ChunkSource { kPool, kHost, kDisk, kRemote, kComputed };

const char* ChunkSourceName(ChunkSource source);  // "pool", "host", "disk", "remote", "computed"

struct TierHit {
  ChunkSource source = ChunkSource::kHost;  // kHost, kDisk or kRemote
  uint64_t stored_bytes = 0;
  std::string origin;  // the cache server holding it (HOST:PORT), empty for the embedded tier
  // Where on that server ("host", "disk"; empty when unknown): a chunk a server must read
  // from its disk first is slower to fetch, and is estimated apart.
  std::string server_tier;
};

struct FetchedChunk {
  ChunkBytes stored;  // header + payload (common/chunk_codec.h), unverified
  ChunkSource source = ChunkSource::kHost;
  std::string origin;
  // The payload's checksum is known good: the tier checked it as it read the bytes, or they
  // are read in place from memory whose owner checked them at admission (the embedded
  // tier's pages, a same-host server's arena).
  bool payload_verified = false;
  // Of the fetch's time, what went to setting the transport up (a same-host session: the
  // arena mapped and page-locked, once per server): not the source's cost per chunk, so the
  // fetch-or-recompute estimate leaves it out.
  double setup_seconds = 0;
};

struct LeaseAnswer {
  enum class State { kGranted, kStored, kHeld, kUnavailable };
  State state = State::kUnavailable;
  uint64_t lease_id = 0;
  std::chrono::milliseconds remaining{0};
};

// Where a publication is written before it is committed: the tier's own host pages where
// it has them (no copy between the export and the store), else a buffer sent at Commit.
// Not thread-safe: one publisher thread fills and commits it. Destroyed without Commit,
// the publication is abandoned (its pages go back, its lease is not released).
class PublishSlot {
 public:
  virtual ~PublishSlot() = default;
  // Writable pieces covering the stored chunk (header + payload), in order.
  virtual const MutablePieces& Pieces() = 0;
  // Stores the bytes written (every byte, header first). Call once.
  virtual absl::Status Commit() = 0;
};

// Chunks and bytes a tier moved, per transport (cache servers: gRPC, or shared memory on the
// same host); zeros for a tier without transports (the embedded one).
struct TransportStats {
  uint64_t grpc_chunks = 0, grpc_bytes = 0;
  uint64_t shm_chunks = 0, shm_bytes = 0;
  uint64_t cuda_ipc_chunks = 0, cuda_ipc_bytes = 0;  // from a same-host server's GPU tier
  uint64_t nccl_chunks = 0, nccl_bytes = 0;          // from a server's GPU tier over a peer link (or its socket twin)
  uint64_t peer_sessions = 0;                        // peer link sessions ready now
  uint64_t shm_fallbacks = 0;                        // fetches tried over shm and served by gRPC (auto)
  // Same-host fetches (shm or cuda_ipc) that took a lease their lookup had taken (no call),
  // and such leases released unused (the chunk computed instead, or held past its time).
  uint64_t lookup_leases_used = 0, lookup_leases_unused = 0;
  uint64_t shm_published_chunks = 0, shm_published_bytes = 0;  // committed over shm
  uint64_t shm_sessions = 0;                                   // same-host sessions open now
};

// Implementations are thread-safe: the chunk pipeline calls every method from several
// threads at once (lookups, fetches and lease waits of different chunks, publications).
class ChunkTier {
 public:
  virtual ~ChunkTier() = default;
  // One answer per key (nullopt: a miss, or its server is unreachable or busy).
  virtual std::vector<std::optional<TierHit>> Lookup(std::span<const Hash128> keys) = 0;
  // The stored chunk; any error means "compute it".
  virtual absl::StatusOr<FetchedChunk> Fetch(const Hash128& key) = 0;
  // The caller looked `key` up and will not fetch it (it computes the chunk instead): what
  // the lookup holds for a fetch (a lease taken ahead) goes now rather than when it expires.
  virtual void NotFetching(const Hash128& key) {}
  // Single flight: granted (compute and publish), stored (fetch), held by another (after
  // waiting up to `wait`), or unavailable (compute without a lease).
  virtual LeaseAnswer Lease(const Hash128& key, std::chrono::milliseconds ttl, std::chrono::milliseconds wait) = 0;
  virtual void ReleaseLease(const Hash128& key, uint64_t lease_id) = 0;
  // The holder is still computing: the lease now ends `ttl` from now. NOT_FOUND when it no
  // longer holds the key (expired, taken over, published); any error ends its renewals.
  virtual absl::Status RenewLease(const Hash128& key, uint64_t lease_id, std::chrono::milliseconds ttl) = 0;
  // A fetched chunk was refused (MAC, non-finite values, checksum: `reason`): the tier
  // drops it if it still stores that version (the same `header`), so the next fetcher
  // computes it instead of refusing it again. Best effort; never fails the caller.
  virtual void ReportInvalid(const Hash128& key, std::string_view header, std::string_view reason) = 0;
  // Stores a whole chunk (header + payload).
  virtual absl::Status Publish(const Hash128& key, const Hash128& model_fingerprint, std::string_view stored,
                               uint64_t lease_id) = 0;
  // A slot of `stored_bytes` for a chunk written in place, then committed. The default is
  // a string that Commit hands to Publish. RESOURCE_EXHAUSTED when the tier has no room.
  virtual absl::StatusOr<std::unique_ptr<PublishSlot>> BeginPublish(const Hash128& key,
                                                                    const Hash128& model_fingerprint,
                                                                    uint64_t stored_bytes, uint64_t lease_id);
  virtual std::string Describe() const = 0;
  // Counters since the tier was made (for metrics). Thread-safe.
  virtual TransportStats transport_stats() const { return {}; }
};

}  // namespace lazykv
