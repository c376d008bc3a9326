// Where a chunk missing from the local pool comes from (DESIGN.md section 4): the cache
// tier if it holds it, else this worker computes it under the tier's lease and publishes
// it in the background (generation never waits for the upload). A worker told that
// another holds the lease waits for that publication, and computes itself if the lease
// expires first.
#pragma once

#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <thread>

#include "common/mutex.h"
#include "worker/tier/chunk_tier.h"

namespace lazykv {

struct ResolverOptions {
  std::chrono::milliseconds lease_ttl{10000};
  std::chrono::milliseconds max_wait{30000};  // in total, for one chunk
};

struct ResolverStats {
  uint64_t fetched = 0;
  uint64_t fetch_failures = 0;
  uint64_t computed = 0;
  uint64_t lease_waits = 0;
  uint64_t published = 0;
  uint64_t publish_failures = 0;
};

// Thread-safe: the engine calls Lookup and Resolve from worker threads (one per pending
// chunk) while its scheduling thread calls PublishAsync; a thread of its own uploads.
class ChunkResolver {
 public:
  ChunkResolver(std::unique_ptr<ChunkTier> tier, ResolverOptions options);
  ~ChunkResolver();  // finishes pending publications

  // What to do about a chunk missing from the local pool.
  struct Decision {
    std::optional<FetchedChunk> fetched;  // set: use these bytes
    uint64_t lease_id = 0;                // else compute; publish under this lease (0: none)
  };

  std::vector<std::optional<TierHit>> Lookup(std::span<const Hash128> keys) { return tier_->Lookup(keys); }
  // `hint`: this key's answer from a Lookup made for the same request.
  Decision Resolve(const Hash128& key, const std::optional<TierHit>& hint);
  // Queues a computed chunk for upload; `lease_id` from Resolve.
  void PublishAsync(const Hash128& key, const Hash128& model_fingerprint, std::string stored, uint64_t lease_id);
  // Blocks until every queued publication has finished.
  void Flush();

  ResolverStats stats() const;
  ChunkTier& tier() { return *tier_; }

 private:
  struct Publication {
    Hash128 key, fingerprint;
    std::string stored;
    uint64_t lease_id = 0;
  };
  std::optional<FetchedChunk> TryFetch(const Hash128& key) ABSL_LOCKS_EXCLUDED(mu_);
  Decision Compute(uint64_t lease_id) ABSL_LOCKS_EXCLUDED(mu_);  // counts a computation
  void PublisherLoop() ABSL_LOCKS_EXCLUDED(mu_);

  const std::unique_ptr<ChunkTier> tier_;  // thread-safe itself (chunk_tier.h)
  const ResolverOptions options_;
  mutable Mutex mu_;
  CondVar work_;  // queue_ gained an entry, or stopping_
  CondVar idle_;  // queue_ drained and nothing in flight
  std::deque<Publication> queue_ ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = false;  // a publication is in flight
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  ResolverStats stats_ ABSL_GUARDED_BY(mu_);
  std::thread publisher_;
};

}  // namespace lazykv
