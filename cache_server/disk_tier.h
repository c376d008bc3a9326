// The SSD tier (DESIGN.md section 4): chunk values in one preallocated value file cut into
// fixed regions (cache_server/value_file.h), RocksDB only as their index. The directory
// holds `values` (its size fixed at open) and `index/` (RocksDB: small records, no blob
// files), so what it takes on disk stays within the byte cap: see IndexBudgetBytes.
//
// Writing: the value file is a circular log. A chunk is appended at the write head, 4 KiB
// aligned, taking at least 8 KiB (which bounds the index's size); it may cross region boundaries (a chunk larger than a
// region spans contiguous regions; one larger than half the file is refused with RESOURCE_EXHAUSTED). When the head
// enters a region, that region is reopened: every chunk touching it leaves the index (FIFO eviction, a region at a
// time, counted) and the region gets a fresh epoch, written to its header slot before any of its bytes are overwritten.
// A chunk's value is written (pwrite, outside the lock) before its index record (key -> offset, length, epoch of the
// last region it touches, payload checksum), so the index never names bytes not written.
//
// Durability: values and index records reach the page cache before Put returns, so they
// survive kill -9; nothing is fdatasync'ed on the put path (Flush syncs the value file and
// RocksDB's WAL). After a power loss a record may name bytes that never reached the disk:
// reads check them (below), so that costs a DATA_LOSS miss, never wrong bytes.
//
// Restart: an index record is valid when the last region it touches still has its epoch
// and no region it touches has a larger one; the others (their region was reused: a crash
// between reopening a region and deleting its chunks' records) are deleted and counted.
// The write head resumes after the newest region's last valid chunk.
//
// Reads: pread outside the lock, then the regions' epochs are checked again: a chunk
// whose region was reopened during the read is NOT_FOUND, never DATA_LOSS or other bytes.
// Then the chunk codec's checks (header, length, payload checksum) and the key and
// checksum of the index record; a value failing them is dropped and reported DATA_LOSS.
//
// Scrub: a background thread reads every indexed chunk at a bounded rate and drops the
// corrupt ones (as a read would); after each pass it verifies RocksDB's whole-file
// checksums (crc32c, recorded for every SST file) of the index.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "cache_server/value_file.h"
#include "common/chunk_key.h"
#include "common/mutex.h"

namespace rocksdb {
class DB;
}

namespace lazykv::cache {

struct DiskTierOptions {
  std::string path;
  uint64_t capacity_bytes = 0;  // the directory's byte cap: value file + index budget
  // The largest region; smaller when needed to give the file at least kMinRegions regions.
  uint64_t region_bytes = 32ull << 20;
  uint64_t scrub_bytes_per_second = 16ull << 20;  // 0: no background scrub (ScrubPass still works)
  bool preallocate = false;                       // reserve the value file's blocks at open (value_file.h)
};

struct DiskTierStats {
  uint64_t capacity = 0, value_file_bytes = 0, region_bytes = 0, regions = 0;
  uint64_t used = 0, entries = 0;
  uint64_t regions_reused = 0;        // regions reopened while holding chunks
  uint64_t chunks_evicted = 0;        // chunks that left the index when their region was reopened
  uint64_t stale_at_open = 0;         // index records dropped at open: their region was reused
  uint64_t corrupt_dropped = 0;       // chunks dropped by a read or the scrub for failing their checks
  uint64_t scrub_corrupt = 0;         // of those, found by the scrub
  uint64_t scrubbed_bytes = 0;        // read by the scrub
  uint64_t scrub_passes = 0;          // completed passes over the index
  uint64_t index_check_failures = 0;  // RocksDB file checksum verifications that failed
};

// Thread-safe: every method may be called from any thread. The index is changed under the
// tier's lock (with its small RocksDB writes); values are written and read outside it, so
// lookups never wait for a value's I/O.
class DiskTier {
 public:
  static constexpr uint32_t kMinRegions = 16;

  // What the directory keeps besides the value file: RocksDB's WAL (about 1 MiB at most),
  // info LOG (3 x 256 KiB at most), MANIFEST (256 KiB before it rolls) and OPTIONS, and its
  // SST files (at most one index record per 8 KiB of values, measured at under 120 bytes
  // each with a compaction's garbage): 4 MiB + capacity / 64. The value file takes the
  // capacity minus this.
  static uint64_t IndexBudgetBytes(uint64_t capacity_bytes);

  static absl::StatusOr<std::unique_ptr<DiskTier>> Open(const DiskTierOptions& options);
  ~DiskTier();  // stops the scrub

  // Starts the background scrub (when scrub_bytes_per_second > 0). `on_drop` is called,
  // without the tier's lock, with each chunk the scrub drops as corrupt.
  void StartScrub(std::function<void(const Hash128&)> on_drop);

  // Stores a chunk (header + payload, given as contiguous pieces whose first
  // kChunkHeaderBytes decode as its header). Returns the keys evicted to make room.
  absl::StatusOr<std::vector<Hash128>> Put(const Hash128& key, const std::vector<std::string_view>& pieces,
                                           uint64_t size);
  // The stored chunk, checked. A corrupt value is dropped and reported as DATA_LOSS; an
  // absent one is NOT_FOUND, also when it leaves the tier (evicted or deleted) while read.
  absl::StatusOr<std::string> Get(const Hash128& key);
  std::optional<uint64_t> SizeOf(const Hash128& key) const;
  bool Delete(const Hash128& key);
  // fdatasync of the value file, then RocksDB's WAL synced.
  absl::Status Flush();

  // One unthrottled scrub pass over every indexed chunk; returns how many were dropped.
  uint64_t ScrubPass();

  uint64_t capacity_bytes() const { return capacity_; }
  uint64_t used_bytes() const;
  uint64_t entries() const;
  DiskTierStats stats() const;
  // Where a chunk's bytes start in the value file (tests and tools).
  std::optional<uint64_t> FileOffsetOf(const Hash128& key) const;
  // The RocksDB key of a chunk's index record (tests and tools).
  static std::string IndexRecordKey(const Hash128& key);
  static std::string ValueFilePath(const std::string& dir) { return dir + "/values"; }
  static std::string IndexPath(const std::string& dir) { return dir + "/index"; }

 private:
  struct Entry {
    uint64_t offset = 0, size = 0, epoch = 0, checksum = 0;
    friend bool operator==(const Entry&, const Entry&) = default;
  };
  struct Region {
    uint64_t epoch = 0;
    int writers = 0;                                   // puts writing into it now
    std::vector<std::pair<Hash128, uint64_t>> chunks;  // (key, offset) of chunks touching it
  };
  struct Placement {
    Entry entry;
    uint32_t first = 0, last = 0;
  };

  DiskTier(std::unique_ptr<rocksdb::DB> db, std::unique_ptr<ValueFile> file, const DiskTierOptions& options);
  absl::Status LoadIndex(const std::vector<uint64_t>& epochs, bool file_created) ABSL_LOCKS_EXCLUDED(mu_);
  // Reserves bytes at the write head, reopening the regions it enters (their chunks go to
  // *victims); waits while a region to reopen is still being written.
  absl::StatusOr<Placement> PlaceLocked(uint64_t size, std::vector<Hash128>* victims)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ReopenRegionLocked(uint32_t region, std::vector<Hash128>* victims) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // True while `entry` is indexed under `key` and every region it touches is unchanged.
  bool StillValidLocked(const Hash128& key, const Entry& entry) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool RegionsValidLocked(const Entry& entry) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UnindexLocked(const Hash128& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status DeleteLocked(const Hash128& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reads an entry's bytes and checks them. NOT_FOUND when it left the tier meanwhile;
  // DATA_LOSS when corrupt (then dropped, counted, and *dropped set).
  absl::StatusOr<std::string> ReadChecked(const Hash128& key, const Entry& entry, bool from_scrub, bool* dropped)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Scrubs the chunks starting in `region`; stops early (false) when `keep_going` says so.
  bool ScrubRegion(uint32_t region, const std::function<bool(uint64_t bytes)>& keep_going, uint64_t* dropped);
  void ScrubLoop();
  void VerifyIndexFiles();

  const std::unique_ptr<rocksdb::DB> db_;
  const std::unique_ptr<ValueFile> file_;
  const uint64_t capacity_;
  const uint64_t scrub_rate_;
  mutable Mutex mu_;
  CondVar region_written_;  // a region's writers dropped to 0
  uint64_t used_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t max_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t head_ ABSL_GUARDED_BY(mu_) = 0;                    // file offset of the next write
  std::optional<uint32_t> open_region_ ABSL_GUARDED_BY(mu_);  // the newest region reopened
  std::vector<Region> regions_ ABSL_GUARDED_BY(mu_);
  std::unordered_map<Hash128, Entry, Hash128Hasher> index_ ABSL_GUARDED_BY(mu_);
  DiskTierStats counters_ ABSL_GUARDED_BY(mu_);

  Mutex scrub_mu_;  // the scrub thread's lifecycle
  CondVar scrub_wake_;
  bool stopping_ ABSL_GUARDED_BY(scrub_mu_) = false;
  std::function<void(const Hash128&)> on_scrub_drop_;  // set before the thread starts
  std::thread scrub_thread_;
};

}  // namespace lazykv::cache
