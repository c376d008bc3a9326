#include "cache_server/disk_tier.h"

#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/slice.h>
#include <rocksdb/write_batch.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "absl/strings/str_format.h"
#include "common/chunk_codec.h"
#include "common/crash_point.h"
#include "common/status_macros.h"

namespace lazykv::cache {
namespace {

std::string RecordKey(char kind, const Hash128& key) {
  std::string out(17, '\0');
  out[0] = kind;
  // Big-endian so that keys sort by their hex spelling.
  for (int i = 0; i < 8; ++i) {
    out[1 + i] = static_cast<char>(key.high >> (56 - 8 * i));
    out[9 + i] = static_cast<char>(key.low >> (56 - 8 * i));
  }
  return out;
}

Hash128 KeyOfRecord(std::string_view record) {
  Hash128 key;
  for (int i = 0; i < 8; ++i) {
    key.high = (key.high << 8) | static_cast<uint8_t>(record[1 + i]);
    key.low = (key.low << 8) | static_cast<uint8_t>(record[9 + i]);
  }
  return key;
}

struct MetaRecord {
  uint64_t size = 0;
  uint64_t seq = 0;
};

absl::Status FromRocks(const rocksdb::Status& s, std::string_view what) {
  if (s.ok()) return absl::OkStatus();
  return absl::InternalError(absl::StrFormat("rocksdb %s: %s", std::string(what), s.ToString()));
}

}  // namespace

absl::StatusOr<std::unique_ptr<DiskTier>> DiskTier::Open(const DiskTierOptions& options) {
  if (options.capacity_bytes == 0) return absl::InvalidArgumentError("disk capacity must be positive");
  rocksdb::Options db_options;
  db_options.create_if_missing = true;
  // Large values live in blob files; the LSM tree holds only small records and blob indexes.
  db_options.enable_blob_files = true;
  db_options.min_blob_size = 4096;
  db_options.blob_file_size = std::clamp<uint64_t>(options.capacity_bytes / 8, 1 << 20, 256ull << 20);
  db_options.enable_blob_garbage_collection = true;
  db_options.blob_garbage_collection_age_cutoff = 0.5;
  db_options.blob_garbage_collection_force_threshold = 0.5;
  db_options.write_buffer_size = std::clamp<uint64_t>(options.capacity_bytes / 16, 1 << 20, 64ull << 20);
  db_options.max_background_jobs = 2;
  // RocksDB's info LOG rotated by size: at most 3 files of 1 MiB (it grew without bound).
  db_options.max_log_file_size = 1 << 20;
  db_options.keep_log_file_num = 2;
  rocksdb::DB* raw = nullptr;
  const rocksdb::Status s = rocksdb::DB::Open(db_options, options.path, &raw);
  if (!s.ok()) {
    if (s.IsIOError() && s.ToString().find("lock") != std::string::npos) {
      return absl::FailedPreconditionError(
          absl::StrFormat("data dir %s is in use by another process (%s)", options.path, s.ToString()));
    }
    return absl::InternalError(absl::StrFormat("cannot open RocksDB at %s: %s", options.path, s.ToString()));
  }
  std::unique_ptr<DiskTier> tier(new DiskTier(std::unique_ptr<rocksdb::DB>(raw), options.capacity_bytes));
  RETURN_IF_ERROR(tier->LoadIndex());
  // A restart with a smaller cap trims the oldest chunks.
  MutexLock lock(&tier->mu_);
  while (tier->used_ > tier->capacity_ && !tier->lru_.empty()) {
    const Hash128 oldest = tier->lru_.back();  // a copy: deleting it frees the LRU node
    RETURN_IF_ERROR(tier->DeleteLocked(oldest));
  }
  return tier;
}

DiskTier::DiskTier(std::unique_ptr<rocksdb::DB> db, uint64_t capacity) : db_(std::move(db)), capacity_(capacity) {}

DiskTier::~DiskTier() {
  if (db_) db_->Close();
}

absl::Status DiskTier::LoadIndex() {
  std::map<uint64_t, std::pair<Hash128, uint64_t>> by_seq;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek("m"); it->Valid() && it->key().starts_with("m"); it->Next()) {
    if (it->key().size() != 17 || it->value().size() != sizeof(MetaRecord)) continue;
    MetaRecord meta;
    std::memcpy(&meta, it->value().data(), sizeof(meta));
    by_seq[meta.seq] = {KeyOfRecord(it->key().ToStringView()), meta.size};
  }
  RETURN_IF_ERROR(FromRocks(it->status(), "scan"));
  MutexLock lock(&mu_);
  for (const auto& [seq, entry] : by_seq) {  // oldest first, so the newest ends at the front
    lru_.push_front(entry.first);
    index_[entry.first] = Entry{entry.second, seq, lru_.begin()};
    used_ += entry.second;
    next_seq_ = seq + 1;
  }
  return absl::OkStatus();
}

// The index is updated under the lock, the RocksDB write (tens of MiB) runs outside it,
// so lookups and reads of other chunks never wait for a write. The victims leave the
// index first and their records go in the same batch as the new value.
absl::StatusOr<std::vector<Hash128>> DiskTier::Put(const Hash128& key, const std::vector<std::string_view>& pieces,
                                                   uint64_t size) {
  if (size > capacity_) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("chunk of %d bytes exceeds the disk tier's capacity of %d bytes", size, capacity_));
  }
  std::vector<Hash128> evicted;
  rocksdb::WriteBatch batch;
  uint64_t seq = 0;
  // By value: UnindexLocked frees the LRU node that lru_.back() refers to.
  auto unindex = [&](const Hash128 victim) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    UnindexLocked(victim);
    (void)batch.Delete(RecordKey('v', victim));
    (void)batch.Delete(RecordKey('m', victim));
  };
  {
    MutexLock lock(&mu_);
    if (index_.contains(key)) unindex(key);
    while (used_ + reserved_ + size > capacity_ && !lru_.empty()) {
      evicted.push_back(lru_.back());
      unindex(lru_.back());
    }
    reserved_ += size;
    seq = next_seq_++;
  }
  // Mid-eviction: the victims have left the index; their records go with this write.
  if (!evicted.empty()) LAZYKV_CRASH_POINT("disk.evict_after_unindex");
  std::vector<rocksdb::Slice> slices(pieces.begin(), pieces.end());
  const std::string value_key = RecordKey('v', key), meta_key = RecordKey('m', key);
  const MetaRecord meta{size, seq};
  const rocksdb::Slice value_key_slice(value_key);
  absl::Status status = FromRocks(batch.Put(rocksdb::SliceParts(&value_key_slice, 1),
                                            rocksdb::SliceParts(slices.data(), static_cast<int>(slices.size()))),
                                  "batch");
  if (status.ok()) {
    status =
        FromRocks(batch.Put(meta_key, rocksdb::Slice(reinterpret_cast<const char*>(&meta), sizeof(meta))), "batch");
  }
  if (status.ok()) status = FromRocks(db_->Write(rocksdb::WriteOptions(), &batch), "write");
  if (status.ok()) LAZYKV_CRASH_POINT("disk.after_write_before_index");
  MutexLock lock(&mu_);
  reserved_ -= size;
  if (!status.ok()) return status;               // the victims' records stay on disk, unindexed, until the next start
  if (index_.contains(key)) UnindexLocked(key);  // a concurrent Put of the same key won
  lru_.push_front(key);
  index_[key] = Entry{size, seq, lru_.begin()};
  used_ += size;
  return evicted;
}

absl::StatusOr<std::string> DiskTier::Get(const Hash128& key) {
  uint64_t seq = 0;
  {
    MutexLock lock(&mu_);
    auto it = index_.find(key);
    if (it == index_.end()) return absl::NotFoundError(absl::StrFormat("chunk %s is not on disk", key.ToHex()));
    seq = it->second.seq;
    lru_.splice(lru_.begin(), lru_, it->second.pos);
  }
  // Read outside the lock: an eviction or a delete may take the value meanwhile.
  auto still_indexed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = index_.find(key);
    return it != index_.end() && it->second.seq == seq;
  };
  std::string value;
  const rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), RecordKey('v', key), &value);
  absl::Status problem;
  if (s.IsNotFound()) {
    MutexLock lock(&mu_);
    if (!still_indexed()) {
      return absl::NotFoundError(absl::StrFormat("chunk %s left the disk tier while being read", key.ToHex()));
    }
    problem = absl::DataLossError(absl::StrFormat("chunk %s: size record without a value on disk", key.ToHex()));
  } else if (!s.ok()) {
    problem = absl::DataLossError(absl::StrFormat("chunk %s: unreadable on disk: %s", key.ToHex(), s.ToString()));
  } else if (auto chunk = DecodeChunk(value); !chunk.ok()) {
    problem = absl::DataLossError(
        absl::StrFormat("chunk %s on disk is corrupt: %s", key.ToHex(), std::string(chunk.status().message())));
  } else if (chunk->header.key != key) {
    problem = absl::DataLossError(
        absl::StrFormat("chunk %s on disk holds the bytes of chunk %s", key.ToHex(), chunk->header.key.ToHex()));
  }
  if (!problem.ok()) {
    MutexLock lock(&mu_);
    if (still_indexed()) (void)DeleteLocked(key);  // dropped, never served (not a newer value)
    return problem;
  }
  return value;
}

std::optional<uint64_t> DiskTier::SizeOf(const Hash128& key) const {
  MutexLock lock(&mu_);
  auto it = index_.find(key);
  if (it == index_.end()) return std::nullopt;
  return it->second.size;
}

bool DiskTier::Delete(const Hash128& key) {
  MutexLock lock(&mu_);
  if (!index_.contains(key)) return false;
  return DeleteLocked(key).ok();
}

void DiskTier::UnindexLocked(const Hash128& key) {
  auto it = index_.find(key);
  used_ -= it->second.size;
  lru_.erase(it->second.pos);
  index_.erase(it);
}

absl::Status DiskTier::DeleteLocked(const Hash128& key) {
  rocksdb::WriteBatch batch;
  RETURN_IF_ERROR(FromRocks(batch.Delete(RecordKey('v', key)), "batch"));
  RETURN_IF_ERROR(FromRocks(batch.Delete(RecordKey('m', key)), "batch"));
  RETURN_IF_ERROR(FromRocks(db_->Write(rocksdb::WriteOptions(), &batch), "delete"));
  UnindexLocked(key);
  return absl::OkStatus();
}

absl::Status DiskTier::Flush() { return FromRocks(db_->FlushWAL(/*sync=*/true), "flush"); }

uint64_t DiskTier::used_bytes() const {
  MutexLock lock(&mu_);
  return used_;
}

uint64_t DiskTier::entries() const {
  MutexLock lock(&mu_);
  return index_.size();
}

}  // namespace lazykv::cache
