// The cache server's GPU tier (DESIGN.md section 5): the hottest chunks in device memory,
// in front of host RAM and disk. A chunk read from host RAM or disk is promoted (copied in
// by a promoter thread, off the reader's path); when the tier needs room it evicts by the
// same policy as host RAM (S3-FIFO), and a victim that no lower tier holds any more is
// demoted (copied back and stored in host RAM) rather than lost. A worker on the same host
// fetches a chunk from here device to device through the arena's CUDA IPC handle, under a
// read lease that holds the chunk's GpuValue (shm_lease_table.h): eviction drops the
// index entry, and the pages go back only when the last holder lets go.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "cache_server/cache_metrics.h"
#include "cache_server/device_arena.h"
#include "cache_server/eviction_policy.h"
#include "cache_server/tiered_store.h"
#include "common/chunk_codec.h"
#include "common/mutex.h"

namespace lazykv::cache {

// One chunk in device memory: its pages (header and payload, laid out as stored) and a
// host copy of its header, for readers that check it before they copy the payload. Its
// pages go back to the arena when the last holder lets go. Immutable once stored.
class GpuValue {
 public:
  GpuValue(std::shared_ptr<DeviceArena> arena, std::vector<uint32_t> pages, uint64_t size, std::string header)
      : arena_(arena), pages_(std::move(pages)), size_(size), header_(std::move(header)) {}
  ~GpuValue() { arena_->Free(pages_); }
  GpuValue(const GpuValue&) = delete;
  GpuValue& operator=(const GpuValue&) = delete;
  std::span<const uint32_t> pages() const { return pages_; }
  uint64_t size() const { return size_; }  // header + payload
  const std::string& header() const { return header_; }
  // The stored bytes, copied back to the host (tests, demotion).
  absl::StatusOr<std::string> ReadAll() const;

 private:
  const std::shared_ptr<DeviceArena> arena_;  // a leased value may outlive the tier
  const std::vector<uint32_t> pages_;
  const uint64_t size_;
  const std::string header_;
};

struct GpuTierOptions {
  uint64_t capacity_bytes = 0;
  uint64_t page_bytes = 2ull << 20;
  int device = 0;
  bool emulate = false;  // host memory standing in for the GPU (tests, CI)
  std::string eviction_policy = "s3fifo";
  // Promotions waiting for the promoter thread; past it a read is not promoted.
  size_t max_pending_promotions = 16;
};

struct GpuTierStats {
  uint64_t capacity = 0, used = 0, entries = 0;
  uint64_t promotions = 0, evictions = 0, demotions = 0;
  uint64_t pending_promotions = 0;
};

// Thread-safe: every method may be called from any thread. One lock guards the index; it
// is never held across a copy.
class GpuTier {
 public:
  // `stored_below(key)`: whether host RAM or disk still holds the key (a victim that they
  // do not is demoted through `demote`, which stores its bytes there). Both are called on
  // the promoter thread, without the tier's lock.
  static absl::StatusOr<std::unique_ptr<GpuTier>> Create(const GpuTierOptions& options,
                                                         std::shared_ptr<CacheMetrics> metrics,
                                                         std::function<bool(const Hash128&)> stored_below,
                                                         std::function<void(const Hash128&, std::string)> demote);
  ~GpuTier();  // stops the promoter (pending promotions are dropped)

  // The chunk, counted as a read for eviction; null when not here.
  std::shared_ptr<const GpuValue> Find(const Hash128& key) ABSL_LOCKS_EXCLUDED(mu_);
  bool Contains(const Hash128& key) const ABSL_LOCKS_EXCLUDED(mu_);
  // Whether RequestPromotion would queue the key now (so a caller can skip preparing it).
  bool WouldQueue(const Hash128& key, uint64_t bytes) const ABSL_LOCKS_EXCLUDED(mu_);
  // Whether a chunk of `bytes` fits in free pages now (no eviction).
  bool HasRoomFor(uint64_t bytes) const { return bytes > 0 && arena_->PagesFor(bytes) <= arena_->free_pages(); }
  // Queues a copy of `chunk` (just read from host RAM or disk, checked) into device memory.
  // Never blocks: nothing happens when the key is here or queued, the queue is full, or
  // the chunk is larger than the tier.
  void RequestPromotion(const Hash128& key, ChunkReader chunk) ABSL_LOCKS_EXCLUDED(mu_);
  // The promoter's work, on the calling thread (tests): evicts as needed, copies, indexes.
  // RESOURCE_EXHAUSTED when no room frees (leased pages).
  absl::Status Promote(const Hash128& key, const ChunkReader& chunk) ABSL_LOCKS_EXCLUDED(mu_);
  // Drops the key's copy (its pages go back once no lease holds them), a queued promotion of
  // it, and one under way or a demotion of it pending (they end without storing it). True
  // when it was here.
  bool Delete(const Hash128& key) ABSL_LOCKS_EXCLUDED(mu_);
  // Blocks until every queued promotion has run (tests).
  void WaitForPromotions() ABSL_LOCKS_EXCLUDED(mu_);

  GpuTierStats stats() const ABSL_LOCKS_EXCLUDED(mu_);
  const DeviceArena& arena() const { return *arena_; }

 private:
  struct Pending {
    Hash128 key;
    ChunkReader chunk;
  };
  GpuTier(const GpuTierOptions& options, std::shared_ptr<DeviceArena> arena, std::unique_ptr<EvictionPolicy> policy,
          std::shared_ptr<CacheMetrics> metrics, std::function<bool(const Hash128&)> stored_below,
          std::function<void(const Hash128&, std::string)> demote);
  using Victims = std::vector<std::pair<Hash128, std::shared_ptr<const GpuValue>>>;
  using Demotions = std::vector<std::pair<Hash128, std::string>>;
  bool WouldQueueLocked(const Hash128& key, uint64_t bytes) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PromoterLoop() ABSL_LOCKS_EXCLUDED(mu_);
  // Promote's work; the victims that no lower tier holds are read back into *demote, to be
  // stored below once the promoted chunk's reader has let go of its host pages (storing
  // them may need those pages).
  absl::Status PromoteInto(const Hash128& key, const ChunkReader& chunk, Demotions* demote) ABSL_LOCKS_EXCLUDED(mu_);
  // The same for a key the caller has put in in_flight_ (so that a Delete from then on leaves
  // a tombstone); takes it out however it ends.
  absl::Status PromoteClaimed(const Hash128& key, const ChunkReader& chunk, Demotions* demote) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether `key` may be promoted now (neither stored nor under way); if so, marks it in flight.
  bool ClaimLocked(const Hash128& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Evicts until `pages` are free or nothing is left to evict; the victims into *victims.
  void EvictForLocked(uint64_t pages, Victims* victims) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reads back the victims no lower tier holds into *demote, then lets every victim go.
  void ReadBackOrDrop(Victims victims, Demotions* demote) ABSL_LOCKS_EXCLUDED(mu_);
  void Demote(Demotions demote) ABSL_LOCKS_EXCLUDED(mu_);
  void UpdateGaugesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const GpuTierOptions options_;
  const std::shared_ptr<DeviceArena> arena_;
  const std::shared_ptr<CacheMetrics> metrics_;
  const std::function<bool(const Hash128&)> stored_below_;
  const std::function<void(const Hash128&, std::string)> demote_;

  mutable Mutex mu_;
  const std::unique_ptr<EvictionPolicy> policy_ ABSL_PT_GUARDED_BY(mu_);
  std::unordered_map<Hash128, std::shared_ptr<const GpuValue>, Hash128Hasher> index_ ABSL_GUARDED_BY(mu_);
  uint64_t used_ ABSL_GUARDED_BY(mu_) = 0;
  GpuTierStats counts_ ABSL_GUARDED_BY(mu_);  // its promotions, evictions, demotions, pending
  std::deque<Pending> pending_ ABSL_GUARDED_BY(mu_);
  // Keys being copied in, or evicted and not yet demoted; a Delete of one leaves a tombstone
  // that ends the copy or the demotion without storing it.
  absl::flat_hash_set<Hash128, Hash128Hasher> in_flight_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<Hash128, Hash128Hasher> tombstones_ ABSL_GUARDED_BY(mu_);
  bool promoting_ ABSL_GUARDED_BY(mu_) = false;  // the promoter is copying one
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  CondVar work_;  // pending_ gained one, or stopping_
  CondVar idle_;  // pending_ drained and nothing copying
  std::thread promoter_;
};

}  // namespace lazykv::cache
