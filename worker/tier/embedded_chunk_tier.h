// The cache tier inside the worker's process (host RAM + RocksDB in a local directory):
// the default on one machine, when no --cache-servers are given.
#pragma once

#include <memory>

#include "cache_server/lease_table.h"
#include "cache_server/tiered_store.h"
#include "worker/tier/chunk_tier.h"

namespace lazykv {

// Thread-safe, as every ChunkTier: the store and the lease table are. Fetch hands out the
// store's pages in place (the fetched chunk keeps them alive), already checked.
class EmbeddedChunkTier final : public ChunkTier {
 public:
  static absl::StatusOr<std::unique_ptr<EmbeddedChunkTier>> Open(const cache::TieredStoreOptions& options);

  std::vector<std::optional<TierHit>> Lookup(std::span<const Hash128> keys) override;
  absl::StatusOr<FetchedChunk> Fetch(const Hash128& key) override;
  LeaseAnswer Lease(const Hash128& key, std::chrono::milliseconds ttl, std::chrono::milliseconds wait) override;
  void ReleaseLease(const Hash128& key, uint64_t lease_id) override;
  absl::Status RenewLease(const Hash128& key, uint64_t lease_id, std::chrono::milliseconds ttl) override;
  // In process the report is trusted: the chunk is dropped when its header still matches.
  void ReportInvalid(const Hash128& key, std::string_view header, std::string_view reason) override;
  absl::Status Publish(const Hash128& key, const Hash128& model_fingerprint, std::string_view stored,
                       uint64_t lease_id) override;
  // The store's own host pages, written in place by the publisher (no copy between the
  // export and the store); may wait up to the store's space_wait for room.
  absl::StatusOr<std::unique_ptr<PublishSlot>> BeginPublish(const Hash128& key, const Hash128& model_fingerprint,
                                                            uint64_t stored_bytes, uint64_t lease_id) override;
  std::string Describe() const override;

  cache::TieredStore& store() { return *store_; }

 private:
  explicit EmbeddedChunkTier(std::unique_ptr<cache::TieredStore> store);
  std::unique_ptr<cache::TieredStore> store_;
  cache::LeaseTable leases_;
};

}  // namespace lazykv
