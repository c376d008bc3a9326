// The cache tier's storage (DESIGN.md section 4): host RAM in front of the disk tier
// (a preallocated value file of regions, RocksDB as its index: disk_tier.h).
// - Put lands in host RAM and is written through to disk by a background writer (off
//   the request path), so a chunk survives a killed process within about a second.
// - What host RAM evicts stays on disk (a demotion; written then if the disk copy was
//   itself evicted); what is read from disk goes back to host RAM (a promotion).
// - Every read checks the chunk's checksum; a corrupt value is counted, dropped and
//   reported (DATA_LOSS), never served. The disk tier's scrub drops corrupt values in the
//   background; they are counted the same way.
// A GPU tier would sit in front of host RAM (the tier enum reserves it).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "cache_server/cache_metrics.h"
#include "cache_server/disk_tier.h"
#include "cache_server/eviction_policy.h"
#include "cache_server/host_arena.h"
#include "common/chunk_codec.h"
#include "common/mutex.h"

namespace lazykv::cache {

enum class StoreTier { kHost, kDisk };

struct TieredStoreOptions {
  uint64_t host_capacity_bytes = 1ull << 30;
  uint64_t disk_capacity_bytes = 0;                    // 0: no disk tier
  std::string data_dir;                                // the disk tier's directory (needed with a disk tier)
  uint64_t disk_region_bytes = 32ull << 20;            // the disk tier's largest region (disk_tier.h)
  uint64_t disk_scrub_bytes_per_second = 16ull << 20;  // its background scrub; 0: none
  bool disk_preallocate = false;                       // reserve the value file's blocks at open
  uint64_t page_bytes = 256 << 10;
  std::string eviction_policy = "s3fifo";
  // header + payload. A chunk larger than the host tier is buffered on its own and written
  // straight to disk; at most this many bytes of such chunks are buffered at once.
  uint64_t max_chunk_bytes = 256ull << 20;
  bool pin_host_memory = true;
  // Back host RAM with a memfd that a worker on the same host can map (the same-host
  // transport, DESIGN.md section 5). Off: private memory.
  bool shared_host_memory = false;
  // How long a writer waits for host pages held by in-flight reads and disk writes.
  std::chrono::milliseconds space_wait{2000};
};

struct ChunkLocation {
  StoreTier tier = StoreTier::kHost;
  uint64_t bytes = 0;  // header + payload
};

// A stored chunk being read: its bytes stay valid while the reader lives. Immutable:
// safe to read from several threads.
class ChunkReader {
 public:
  ChunkReader(StoreTier tier, std::shared_ptr<const HostValue> host) : tier_(tier), host_(std::move(host)) {}
  ChunkReader(StoreTier tier, std::string bytes) : tier_(tier), bytes_(std::move(bytes)) {}
  StoreTier tier() const { return tier_; }
  // The host value read (null when the bytes came from disk): holding it keeps its pages.
  const std::shared_ptr<const HostValue>& host_value() const { return host_; }
  uint64_t size() const { return host_ ? host_->size() : bytes_.size(); }
  void Read(uint64_t offset, uint64_t length, char* out) const;
  // Contiguous pieces covering [offset, offset + length), valid while the reader lives.
  std::vector<std::string_view> Pieces(uint64_t offset, uint64_t length) const;
  std::string ReadAll() const;

 private:
  StoreTier tier_;
  std::shared_ptr<const HostValue> host_;
  std::string bytes_;
};

// A chunk being received into host pages; handed to TieredStore::Commit when complete.
// Not thread-safe: one stream writes it.
// A chunk's bytes as they arrive: in host-RAM pages, or, for a chunk larger than the host
// tier, in a buffer of its own that Commit writes straight to disk.
class ChunkWriter {
 public:
  explicit ChunkWriter(std::shared_ptr<HostValue> value) : value_(std::move(value)), size_(value_->size()) {}
  ChunkWriter(std::string direct, std::function<void()> release)
      : size_(direct.size()), direct_(std::move(direct)), release_(std::move(release)) {}
  ~ChunkWriter() {
    if (release_) release_();
  }
  ChunkWriter(const ChunkWriter&) = delete;
  ChunkWriter& operator=(const ChunkWriter&) = delete;
  uint64_t size() const { return size_; }
  uint64_t written() const { return written_; }
  bool direct_to_disk() const { return value_ == nullptr; }
  // The host pages the chunk is written into, in order (empty when direct to disk).
  std::span<const uint32_t> host_pages() const {
    return value_ ? value_->pages() : std::span<const uint32_t>();
  }
  // INVALID_ARGUMENT when the bytes overrun the announced size.
  absl::Status Append(std::string_view bytes);
  // The value's pages, to be written in place (instead of Append); Commit then takes every
  // byte as written. For a writer that fills the whole chunk (the embedded tier's publisher).
  // The bytes [offset, offset + length) appended so far, in place (checks before Commit).
  std::vector<std::string_view> WrittenPieces(uint64_t offset, uint64_t length) const {
    if (direct_to_disk()) return {std::string_view(direct_).substr(offset, length)};
    return value_->Pieces(offset, length);
  }
  std::vector<std::span<char>> WritablePieces() {
    written_ = size_;
    if (direct_to_disk()) return {std::span<char>(direct_.data(), direct_.size())};
    return value_->WritablePieces();
  }

 private:
  friend class TieredStore;
  std::shared_ptr<HostValue> value_;  // null: direct to disk
  uint64_t size_ = 0;
  std::string direct_;
  std::function<void()> release_;  // gives the direct buffer's bytes back to the store's budget
  uint64_t written_ = 0;
};

struct TieredStoreStats {
  uint64_t host_capacity = 0, host_used = 0, host_entries = 0;
  uint64_t disk_capacity = 0, disk_used = 0, disk_entries = 0;
  uint64_t pending_disk_writes = 0;
  bool host_pinned = false;
};

// How much of a chunk in host RAM a read checks: header, key and payload checksum; or
// header and key only, for a reader that checks the payload itself (a same-host worker reading
// the pages in place verifies the checksum anyway: a second pass here costs it ~30 ms per
// 64 MiB chunk; it reports a mismatch, and ReportInvalid then checks and drops the chunk).
enum class PayloadCheck { kChecksum, kHeaderOnly };

// Thread-safe: every method may be called from any thread (the service's handlers, the
// embedded tier's resolver threads). One lock guards the host index and the disk-write
// queue; it is never held across RocksDB calls or page copies, which run on the
// caller's thread or the store's disk writer.
class TieredStore {
 public:
  static absl::StatusOr<std::unique_ptr<TieredStore>> Open(const TieredStoreOptions& options,
                                                           std::shared_ptr<CacheMetrics> metrics);
  ~TieredStore();  // flushes pending disk writes

  // Where a chunk is, counted as a lookup (hit or miss) in the metrics.
  std::optional<ChunkLocation> Lookup(const Hash128& key);
  // Where a chunk is, not counted.
  std::optional<ChunkLocation> Locate(const Hash128& key) const;

  // NOT_FOUND, DATA_LOSS (corrupt, now dropped), or the bytes (header + payload). A chunk
  // in host RAM is checked as `check` says (a chunk read from disk always in full).
  absl::StatusOr<ChunkReader> Read(const Hash128& key, PayloadCheck check = PayloadCheck::kChecksum);

  // The chunk's host copy without checks or counting (null when not in host RAM): for a
  // reader that has just read it through Read() from disk, which promoted it.
  std::shared_ptr<const HostValue> HostCopy(const Hash128& key) const;

  // Reserves host pages for a chunk of `size` bytes (header + payload), evicting as
  // needed; RESOURCE_EXHAUSTED past max_chunk_bytes or when no room frees in time. A chunk
  // larger than the whole host tier (with a disk tier) gets a buffer of its own instead,
  // and its Commit writes it straight to disk before returning; RESOURCE_EXHAUSTED when
  // such buffers already hold max_chunk_bytes.
  absl::StatusOr<std::unique_ptr<ChunkWriter>> BeginPut(uint64_t size);
  // Checks the received chunk (complete, its header's key is `key`, checksum) and
  // stores it; true when the key was already stored (the new bytes are dropped).
  absl::StatusOr<bool> Commit(const Hash128& key, std::unique_ptr<ChunkWriter> writer);
  // BeginPut + Append + Commit of a whole chunk.
  absl::StatusOr<bool> Put(const Hash128& key, std::string_view stored);

  // Removes the chunk from both tiers, including a write of it still queued for disk (it
  // would bring the chunk back); waits for one being written. True when anything was removed.
  bool Delete(const Hash128& key);
  // Waits until every chunk committed so far is on disk (and the log synced).
  absl::Status Flush();

  TieredStoreStats stats() const;
  const TieredStoreOptions& options() const { return options_; }
  const HostArena& arena() const { return *arena_; }
  CacheMetrics& metrics() const { return *metrics_; }

 private:
  struct HostEntry {
    std::shared_ptr<HostValue> value;
    bool on_disk = false;
    bool disk_pending = false;
  };
  struct DiskWrite {
    Hash128 key;
    std::shared_ptr<HostValue> value;
  };
  absl::StatusOr<bool> CommitToDisk(const Hash128& key, ChunkWriter& writer) ABSL_LOCKS_EXCLUDED(mu_);

  TieredStore(TieredStoreOptions options, std::unique_ptr<HostArena> arena, std::unique_ptr<EvictionPolicy> policy,
              std::unique_ptr<DiskTier> disk, std::shared_ptr<CacheMetrics> metrics);
  absl::StatusOr<std::shared_ptr<HostValue>> AllocateHostValue(uint64_t size) ABSL_LOCKS_EXCLUDED(mu_);
  // Drops one host entry chosen by the policy; false when none is left.
  // Evicts host values until `pages` can be taken into *taken (empty when the pages
  // still have to free: the caller waits for them). See the definition.
  void EvictForLocked(uint64_t pages, std::vector<uint32_t>* taken) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EvictLocked(const Hash128& victim) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);  // the policy forgot it
  void InsertHostLocked(const Hash128& key, std::shared_ptr<HostValue> value, bool on_disk)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EraseHostLocked(const Hash128& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EnqueueDiskWriteLocked(const Hash128& key, std::shared_ptr<HostValue> value) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DiskWriterLoop() ABSL_LOCKS_EXCLUDED(mu_);
  void UpdateGaugesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const TieredStoreOptions options_;
  const std::unique_ptr<HostArena> arena_;  // thread-safe itself
  const std::shared_ptr<CacheMetrics> metrics_;

  mutable Mutex mu_;
  const std::unique_ptr<EvictionPolicy> policy_ ABSL_PT_GUARDED_BY(mu_);
  std::unordered_map<Hash128, HostEntry, Hash128Hasher> host_ ABSL_GUARDED_BY(mu_);
  uint64_t host_used_ ABSL_GUARDED_BY(mu_) = 0;

  const std::unique_ptr<DiskTier> disk_;  // null without a disk tier; thread-safe itself
  std::deque<DiskWrite> disk_queue_ ABSL_GUARDED_BY(mu_);
  uint64_t disk_in_flight_ ABSL_GUARDED_BY(mu_) = 0;          // taken off the queue, not yet written
  std::optional<Hash128> disk_writing_ ABSL_GUARDED_BY(mu_);  // the key being written now
  // Chunks larger than the host tier, written straight to disk by their Commit.
  absl::flat_hash_set<Hash128, Hash128Hasher> direct_writing_ ABSL_GUARDED_BY(mu_);
  uint64_t direct_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // their buffers' bytes, at most max_chunk_bytes
  CondVar disk_wrote_;                              // a write ended (disk_writing_ cleared)
  CondVar disk_work_;                               // disk_queue_ gained a write, or stopping_
  CondVar disk_idle_;                               // disk_queue_ drained and nothing in flight
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread disk_writer_;
};

}  // namespace lazykv::cache
