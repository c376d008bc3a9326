#include "cache_server/disk_tier.h"

#include <rocksdb/db.h>
#include <rocksdb/file_checksum.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_format.h"
#include "common/byte_size.h"
#include "common/chunk_codec.h"
#include "common/crash_point.h"
#include "common/status_macros.h"

namespace lazykv::cache {
namespace {

constexpr uint32_t kRecordVersion = 1;

// The index record of a chunk, under IndexRecordKey(key).
struct IndexRecord {
  uint32_t version = kRecordVersion;
  uint32_t reserved = 0;
  uint64_t offset = 0, size = 0, epoch = 0, checksum = 0;
};
static_assert(sizeof(IndexRecord) == 40);

Hash128 KeyOfRecord(std::string_view record) {
  Hash128 key;
  for (int i = 0; i < 8; ++i) {
    key.high = (key.high << 8) | static_cast<uint8_t>(record[1 + i]);
    key.low = (key.low << 8) | static_cast<uint8_t>(record[9 + i]);
  }
  return key;
}

absl::Status FromRocks(const rocksdb::Status& s, std::string_view what) {
  if (s.ok()) return absl::OkStatus();
  return absl::InternalError(absl::StrFormat("rocksdb %s: %s", std::string(what), s.ToString()));
}

uint64_t RoundUp(uint64_t n, uint64_t to) { return (n + to - 1) / to * to; }

// What a chunk takes of the value file: 4 KiB aligned, at least kMinSlotBytes, so that the
// index holds at most one record per kMinSlotBytes of values (what its budget assumes).
constexpr uint64_t kMinSlotBytes = 8 << 10;
uint64_t SlotBytes(uint64_t size) { return RoundUp(std::max(size, kMinSlotBytes), ValueFile::kAlign); }

rocksdb::Options IndexOptions() {
  rocksdb::Options o;
  o.create_if_missing = true;
  // Whole-file crc32c of every SST file, recorded in the MANIFEST (checked by the scrub).
  o.file_checksum_gen_factory = rocksdb::GetFileChecksumGenCrc32cFactory();
  // Small records only: a small memtable and WAL, compactions that start early so that the
  // deletes of evicted chunks do not pile up, and nothing preallocated.
  o.write_buffer_size = 512 << 10;
  o.max_write_buffer_number = 2;
  o.max_total_wal_size = 1 << 20;
  o.level0_file_num_compaction_trigger = 2;
  o.target_file_size_base = 4 << 20;
  o.max_bytes_for_level_base = 16 << 20;
  o.max_background_jobs = 2;
  o.allow_fallocate = false;
  o.max_manifest_file_size = 256 << 10;
  // RocksDB's info LOG rotated by size: at most 3 files of 256 KiB.
  o.max_log_file_size = 256 << 10;
  o.keep_log_file_num = 2;
  return o;
}

}  // namespace

std::string DiskTier::IndexRecordKey(const Hash128& key) {
  std::string out(17, '\0');
  out[0] = 'i';
  // Big-endian so that keys sort by their hex spelling.
  for (int i = 0; i < 8; ++i) {
    out[1 + i] = static_cast<char>(key.high >> (56 - 8 * i));
    out[9 + i] = static_cast<char>(key.low >> (56 - 8 * i));
  }
  return out;
}

uint64_t DiskTier::IndexBudgetBytes(uint64_t capacity_bytes) { return (4ull << 20) + capacity_bytes / 64; }

absl::StatusOr<std::unique_ptr<DiskTier>> DiskTier::Open(const DiskTierOptions& options) {
  namespace fs = std::filesystem;
  const uint64_t cap = options.capacity_bytes;
  const uint64_t budget = IndexBudgetBytes(cap);
  if (cap < budget + 2 * kMinRegions * ValueFile::kAlign) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "disk capacity %s is too small: the index takes %s and the value file needs at least %s", FormatByteSize(cap),
        FormatByteSize(budget), FormatByteSize(2 * kMinRegions * ValueFile::kAlign)));
  }
  // The geometry: at least kMinRegions regions of at most options.region_bytes, within cap - budget.
  const uint64_t room = cap - budget;
  const uint64_t largest = std::max<uint64_t>(options.region_bytes / ValueFile::kAlign, 1) * ValueFile::kAlign;
  const uint64_t region =
      std::min(largest, (room - 2 * ValueFile::kAlign) / kMinRegions / ValueFile::kAlign * ValueFile::kAlign);
  ValueFileGeometry geometry{
      .region_bytes = region, .regions = static_cast<uint32_t>(room / region), .preallocate = options.preallocate};
  while (geometry.regions > 2 && ValueFile::FileBytes(geometry) > room) --geometry.regions;

  std::error_code ec;
  if (fs::exists(fs::path(options.path) / "CURRENT", ec)) {
    // The former layout: one RocksDB with the values in blob files. A cache: start empty.
    spdlog::warn("{} holds the former disk tier (RocksDB with blob files): removing it", options.path);
    RETURN_IF_ERROR(FromRocks(rocksdb::DestroyDB(options.path, rocksdb::Options()), "destroy former layout"));
  }
  fs::create_directories(IndexPath(options.path), ec);
  if (ec) return absl::PermissionDeniedError(absl::StrFormat("cannot create %s: %s", options.path, ec.message()));
  rocksdb::DB* raw = nullptr;
  const rocksdb::Status s = rocksdb::DB::Open(IndexOptions(), IndexPath(options.path), &raw);
  if (!s.ok()) {
    if (s.IsIOError() && s.ToString().find("lock") != std::string::npos) {
      return absl::FailedPreconditionError(
          absl::StrFormat("data dir %s is in use by another process (%s)", options.path, s.ToString()));
    }
    return absl::InternalError(absl::StrFormat("cannot open RocksDB at %s: %s", options.path, s.ToString()));
  }
  std::unique_ptr<rocksdb::DB> db(raw);
  bool created = false;
  ASSIGN_OR_RETURN(auto file, ValueFile::Open(ValueFilePath(options.path), geometry, &created));
  ASSIGN_OR_RETURN(const std::vector<uint64_t> epochs, file->ReadEpochs());
  std::unique_ptr<DiskTier> tier(new DiskTier(std::move(db), std::move(file), options));
  RETURN_IF_ERROR(tier->LoadIndex(epochs, created));
  const DiskTierStats st = tier->stats();
  spdlog::info(
      "disk tier {}: value file {} ({} regions of {}{}), index budget {}; {} chunks ({}) indexed, {} stale "
      "records dropped",
      options.path, FormatByteSize(st.value_file_bytes), st.regions, FormatByteSize(st.region_bytes),
      created ? ", new" : "", FormatByteSize(budget), st.entries, FormatByteSize(st.used), st.stale_at_open);
  return tier;
}

DiskTier::DiskTier(std::unique_ptr<rocksdb::DB> db, std::unique_ptr<ValueFile> file, const DiskTierOptions& options)
    : db_(std::move(db)),
      file_(std::move(file)),
      capacity_(options.capacity_bytes),
      scrub_rate_(options.scrub_bytes_per_second) {}

DiskTier::~DiskTier() {
  {
    MutexLock lock(&scrub_mu_);
    stopping_ = true;
  }
  scrub_wake_.SignalAll();
  if (scrub_thread_.joinable()) scrub_thread_.join();
  if (db_) db_->Close();
}

absl::Status DiskTier::LoadIndex(const std::vector<uint64_t>& epochs, bool file_created) {
  MutexLock lock(&mu_);
  regions_.resize(file_->geometry().regions);
  for (size_t r = 0; r < epochs.size(); ++r) {
    regions_[r].epoch = epochs[r];
    max_epoch_ = std::max(max_epoch_, epochs[r]);
  }
  rocksdb::WriteBatch stale;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    IndexRecord record;
    bool valid =
        !file_created && it->key().size() == 17 && it->key()[0] == 'i' && it->value().size() == sizeof(IndexRecord);
    if (valid) {
      std::memcpy(&record, it->value().data(), sizeof(record));
      valid = record.version == kRecordVersion && record.size > 0 && record.epoch > 0 &&
              record.offset >= file_->data_offset() && record.offset % ValueFile::kAlign == 0 &&
              record.offset + record.size <= file_->data_end();
    }
    const Entry entry{record.offset, record.size, record.epoch, record.checksum};
    if (valid && RegionsValidLocked(entry)) {
      const Hash128 key = KeyOfRecord(it->key().ToStringView());
      index_[key] = entry;
      used_ += entry.size;
      for (uint32_t r = file_->RegionOf(entry.offset); r <= file_->RegionOf(entry.offset + entry.size - 1); ++r) {
        regions_[r].chunks.emplace_back(key, entry.offset);
      }
    } else {
      RETURN_IF_ERROR(FromRocks(stale.Delete(it->key()), "batch"));
      ++counters_.stale_at_open;
    }
  }
  RETURN_IF_ERROR(FromRocks(it->status(), "scan"));
  if (stale.Count() > 0) RETURN_IF_ERROR(FromRocks(db_->Write(rocksdb::WriteOptions(), &stale), "drop stale"));
  // The head resumes in the newest region, after its last indexed chunk (bytes past that
  // were never indexed: a crash between a value's write and its index record).
  if (max_epoch_ > 0) {
    const uint32_t newest = static_cast<uint32_t>(std::find(epochs.begin(), epochs.end(), max_epoch_) - epochs.begin());
    open_region_ = newest;
    head_ = file_->RegionStart(newest);
    for (const auto& [key, offset] : regions_[newest].chunks) {
      if (auto found = index_.find(key); found != index_.end())
        head_ = std::max(head_, offset + SlotBytes(found->second.size));
    }
  } else {
    head_ = file_->data_offset();
  }
  return absl::OkStatus();
}

bool DiskTier::RegionsValidLocked(const Entry& entry) const {
  const uint32_t first = file_->RegionOf(entry.offset), last = file_->RegionOf(entry.offset + entry.size - 1);
  if (regions_[last].epoch != entry.epoch) return false;
  for (uint32_t r = first; r < last; ++r) {
    if (regions_[r].epoch == 0 || regions_[r].epoch > entry.epoch) return false;
  }
  return true;
}

bool DiskTier::StillValidLocked(const Hash128& key, const Entry& entry) const {
  auto it = index_.find(key);
  return it != index_.end() && it->second == entry && RegionsValidLocked(entry);
}

absl::Status DiskTier::ReopenRegionLocked(uint32_t region, std::vector<Hash128>* victims) {
  Region& reg = regions_[region];
  bool held = false;
  for (const auto& [key, offset] : reg.chunks) {
    auto it = index_.find(key);
    if (it == index_.end() || it->second.offset != offset) continue;  // gone, or stored again elsewhere
    UnindexLocked(key);
    victims->push_back(key);
    ++counters_.chunks_evicted;
    held = true;
  }
  reg.chunks.clear();
  if (held) ++counters_.regions_reused;
  // The new epoch is in the file before any byte of the region is overwritten.
  RETURN_IF_ERROR(file_->WriteEpoch(region, max_epoch_ + 1));
  reg.epoch = ++max_epoch_;
  return absl::OkStatus();
}

absl::StatusOr<DiskTier::Placement> DiskTier::PlaceLocked(uint64_t size, std::vector<Hash128>* victims) {
  while (true) {
    uint64_t start = head_;
    bool wrapped = !open_region_.has_value();
    if (wrapped || start + size > file_->data_end()) {
      start = file_->data_offset();
      wrapped = true;
    }
    const uint32_t first = file_->RegionOf(start), last = file_->RegionOf(start + size - 1);
    const uint32_t from = wrapped ? first : *open_region_ + 1;  // regions to reopen: [from, last]
    bool busy = false;
    for (uint32_t r = from; r <= last; ++r) busy = busy || regions_[r].writers > 0;
    if (busy) {  // a put still writes there (only with concurrent puts and a small file)
      region_written_.Wait(&mu_);
      continue;
    }
    for (uint32_t r = from; r <= last; ++r) RETURN_IF_ERROR(ReopenRegionLocked(r, victims));
    if (from <= last) open_region_ = last;
    head_ = start + SlotBytes(size);
    for (uint32_t r = first; r <= last; ++r) ++regions_[r].writers;
    return Placement{Entry{start, size, regions_[last].epoch, 0}, first, last};
  }
}

absl::StatusOr<std::vector<Hash128>> DiskTier::Put(const Hash128& key, const std::vector<std::string_view>& pieces,
                                                   uint64_t size) {
  const uint64_t largest = (file_->data_end() - file_->data_offset()) / 2;
  if (size > largest) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "chunk of %d bytes exceeds the disk tier's largest chunk, %d bytes (half its value file)", size, largest));
  }
  std::string header_bytes;
  uint64_t total = 0;
  for (std::string_view p : pieces) {
    total += p.size();
    if (header_bytes.size() < kChunkHeaderBytes) {
      header_bytes.append(p.substr(0, kChunkHeaderBytes - header_bytes.size()));
    }
  }
  if (total != size) {
    return absl::InvalidArgumentError(absl::StrFormat("pieces hold %d bytes, not the %d announced", total, size));
  }
  ASSIGN_OR_RETURN(const ChunkHeader header, DecodeChunkHeader(header_bytes));
  if (header.key != key) {
    return absl::InvalidArgumentError(
        absl::StrFormat("header.key %s does not match the key %s", header.key.ToHex(), key.ToHex()));
  }
  std::vector<Hash128> victims;
  Placement place;
  {
    MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(place, PlaceLocked(size, &victims));
  }
  place.entry.checksum = header.payload_checksum;
  // Mid-eviction: the victims have left the index; their records go with this one.
  if (!victims.empty()) LAZYKV_CRASH_POINT("disk.evict_after_unindex");
  const absl::Status written = file_->Write(place.entry.offset, pieces);
  if (written.ok()) LAZYKV_CRASH_POINT("disk.after_write_before_index");
  MutexLock lock(&mu_);
  for (uint32_t r = place.first; r <= place.last; ++r) {
    if (--regions_[r].writers == 0) region_written_.SignalAll();
  }
  rocksdb::WriteBatch batch;
  for (const Hash128& victim : victims) {
    // A victim stored again since (by a concurrent put) keeps its new record.
    if (!index_.contains(victim)) RETURN_IF_ERROR(FromRocks(batch.Delete(IndexRecordKey(victim)), "batch"));
  }
  const IndexRecord record{
      .offset = place.entry.offset, .size = size, .epoch = place.entry.epoch, .checksum = place.entry.checksum};
  if (written.ok()) {
    RETURN_IF_ERROR(FromRocks(
        batch.Put(IndexRecordKey(key), rocksdb::Slice(reinterpret_cast<const char*>(&record), sizeof(record))),
        "batch"));
  }
  const absl::Status indexed = FromRocks(db_->Write(rocksdb::WriteOptions(), &batch), "write");
  RETURN_IF_ERROR(written);
  RETURN_IF_ERROR(indexed);
  if (index_.contains(key)) UnindexLocked(key);  // the previous version (its record was overwritten)
  index_[key] = place.entry;
  used_ += size;
  for (uint32_t r = place.first; r <= place.last; ++r) regions_[r].chunks.emplace_back(key, place.entry.offset);
  std::erase(victims, key);
  return victims;
}

absl::StatusOr<std::string> DiskTier::ReadChecked(const Hash128& key, const Entry& entry, bool from_scrub,
                                                  bool* dropped) {
  *dropped = false;
  std::string bytes(entry.size, '\0');
  const absl::Status io = file_->Read(entry.offset, entry.size, bytes.data());
  {
    // Reopening a region unindexes its chunks before any of its bytes are overwritten, so
    // a chunk still indexed now was intact during the whole read.
    MutexLock lock(&mu_);
    if (from_scrub) counters_.scrubbed_bytes += entry.size;
    if (!StillValidLocked(key, entry)) {
      return absl::NotFoundError(absl::StrFormat("chunk %s left the disk tier while being read", key.ToHex()));
    }
  }
  absl::Status problem;
  if (!io.ok()) {
    problem = absl::DataLossError(absl::StrFormat("chunk %s: unreadable on disk: %s", key.ToHex(), io.message()));
  } else if (auto chunk = DecodeChunk(bytes); !chunk.ok()) {
    problem = absl::DataLossError(
        absl::StrFormat("chunk %s on disk is corrupt: %s", key.ToHex(), std::string(chunk.status().message())));
  } else if (chunk->header.key != key) {
    problem = absl::DataLossError(
        absl::StrFormat("chunk %s on disk holds the bytes of chunk %s", key.ToHex(), chunk->header.key.ToHex()));
  } else if (chunk->header.payload_checksum != entry.checksum) {
    problem = absl::DataLossError(
        absl::StrFormat("chunk %s on disk is another version than its index record's (checksum)", key.ToHex()));
  }
  if (problem.ok()) return bytes;
  MutexLock lock(&mu_);
  if (StillValidLocked(key, entry)) {  // dropped, never served (and not a newer value)
    (void)DeleteLocked(key);
    ++counters_.corrupt_dropped;
    if (from_scrub) ++counters_.scrub_corrupt;
    *dropped = true;
  }
  return problem;
}

absl::StatusOr<std::string> DiskTier::Get(const Hash128& key) {
  Entry entry;
  {
    MutexLock lock(&mu_);
    auto it = index_.find(key);
    if (it == index_.end()) return absl::NotFoundError(absl::StrFormat("chunk %s is not on disk", key.ToHex()));
    entry = it->second;
  }
  bool dropped = false;
  return ReadChecked(key, entry, /*from_scrub=*/false, &dropped);
}

std::optional<uint64_t> DiskTier::SizeOf(const Hash128& key) const {
  MutexLock lock(&mu_);
  auto it = index_.find(key);
  if (it == index_.end()) return std::nullopt;
  return it->second.size;
}

std::optional<uint64_t> DiskTier::FileOffsetOf(const Hash128& key) const {
  MutexLock lock(&mu_);
  auto it = index_.find(key);
  if (it == index_.end()) return std::nullopt;
  return it->second.offset;
}

bool DiskTier::Delete(const Hash128& key) {
  MutexLock lock(&mu_);
  if (!index_.contains(key)) return false;
  return DeleteLocked(key).ok();
}

void DiskTier::UnindexLocked(const Hash128& key) {
  auto it = index_.find(key);
  used_ -= it->second.size;
  index_.erase(it);  // its (key, offset) pairs in the regions' lists are skipped from now on
}

absl::Status DiskTier::DeleteLocked(const Hash128& key) {
  RETURN_IF_ERROR(FromRocks(db_->Delete(rocksdb::WriteOptions(), IndexRecordKey(key)), "delete"));
  UnindexLocked(key);
  return absl::OkStatus();
}

absl::Status DiskTier::Flush() {
  RETURN_IF_ERROR(file_->Sync());
  return FromRocks(db_->FlushWAL(/*sync=*/true), "flush");
}

uint64_t DiskTier::used_bytes() const {
  MutexLock lock(&mu_);
  return used_;
}

uint64_t DiskTier::entries() const {
  MutexLock lock(&mu_);
  return index_.size();
}

DiskTierStats DiskTier::stats() const {
  MutexLock lock(&mu_);
  DiskTierStats s = counters_;
  s.capacity = capacity_;
  s.value_file_bytes = file_->file_bytes();
  s.region_bytes = file_->geometry().region_bytes;
  s.regions = file_->geometry().regions;
  s.used = used_;
  s.entries = index_.size();
  return s;
}

}  // namespace lazykv::cache
