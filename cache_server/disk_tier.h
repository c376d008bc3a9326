// The SSD tier: RocksDB with blob files for the large chunk values, durable across
// restarts (the write-ahead log survives a killed process). Each chunk is two records:
// "v" + key holds the stored chunk (header + payload), "m" + key a small record of its
// size and write order, so that startup rebuilds the tier's index without reading the
// values. The tier enforces its own byte cap: writes evict the least recently used
// chunks first, so the stored bytes never pass the capacity.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "common/chunk_key.h"
#include "common/mutex.h"

namespace rocksdb {
class DB;
}

namespace lazykv::cache {

struct DiskTierOptions {
  std::string path;
  uint64_t capacity_bytes = 0;
};

// Thread-safe: every method may be called from any thread. The index is changed under the
// tier's lock; a chunk's value is written outside it (lookups never wait for a write) and
// enters the index once on disk, so the index never names a value that is not there.
class DiskTier {
 public:
  static absl::StatusOr<std::unique_ptr<DiskTier>> Open(const DiskTierOptions& options);
  ~DiskTier();

  // Stores a chunk given as contiguous pieces. Returns the keys evicted to make room.
  absl::StatusOr<std::vector<Hash128>> Put(const Hash128& key, const std::vector<std::string_view>& pieces,
                                           uint64_t size);
  // The stored chunk, checked (header, length, checksum). A corrupt value is deleted and
  // reported as DATA_LOSS; an absent one is NOT_FOUND, also when it leaves the tier
  // (evicted or deleted) while being read.
  absl::StatusOr<std::string> Get(const Hash128& key);
  std::optional<uint64_t> SizeOf(const Hash128& key) const;
  bool Delete(const Hash128& key);
  absl::Status Flush();

  uint64_t capacity_bytes() const { return capacity_; }
  uint64_t used_bytes() const;
  uint64_t entries() const;

 private:
  struct Entry {
    uint64_t size = 0;
    uint64_t seq = 0;  // write order: tells this value from a later one under the same key
    std::list<Hash128>::iterator pos;
  };
  DiskTier(std::unique_ptr<rocksdb::DB> db, uint64_t capacity);
  absl::Status LoadIndex() ABSL_LOCKS_EXCLUDED(mu_);  // at Open, before the tier is shared
  absl::Status DeleteLocked(const Hash128& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops an indexed key from the index and the byte count (its records stay).
  void UnindexLocked(const Hash128& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::unique_ptr<rocksdb::DB> db_;
  const uint64_t capacity_;
  mutable Mutex mu_;
  uint64_t used_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t reserved_ ABSL_GUARDED_BY(mu_) = 0;  // bytes being written (not yet in the index)
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  std::list<Hash128> lru_ ABSL_GUARDED_BY(mu_);  // front: most recent
  std::unordered_map<Hash128, Entry, Hash128Hasher> index_ ABSL_GUARDED_BY(mu_);
};

}  // namespace lazykv::cache
