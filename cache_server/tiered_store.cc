#include "cache_server/tiered_store.h"

#include <spdlog/spdlog.h>

#include <filesystem>

#include "absl/strings/str_format.h"
#include "common/crash_point.h"
#include "common/status_macros.h"

namespace lazykv::cache {
namespace {

// Header, key and checksum of a chunk held in host pages.
// A chunk's header (its first bytes) names `key`, and its payload matches the checksum.
absl::Status CheckChunk(uint64_t size, std::string_view header_bytes, const std::vector<std::string_view>& payload,
                        const Hash128& key, PayloadCheck check = PayloadCheck::kChecksum) {
  if (size < kChunkHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("chunk of %d bytes is shorter than its %d-byte header", size, kChunkHeaderBytes));
  }
  ASSIGN_OR_RETURN(const ChunkHeader header, DecodeChunkHeader(header_bytes));
  if (header.key != key) {
    return absl::InvalidArgumentError(
        absl::StrFormat("header.key %s does not match the request key %s", header.key.ToHex(), key.ToHex()));
  }
  if (check == PayloadCheck::kHeaderOnly) {
    if (kChunkHeaderBytes + header.payload_bytes != size) {
      return absl::DataLossError(absl::StrFormat("chunk of %d bytes; its header announces a %d-byte payload", size,
                                                 header.payload_bytes));
    }
    return absl::OkStatus();
  }
  return VerifyChunkPayload(header, payload);
}

absl::Status CheckHostValue(const HostValue& value, const Hash128& key, PayloadCheck check = PayloadCheck::kChecksum) {
  if (value.size() < kChunkHeaderBytes) return CheckChunk(value.size(), "", {}, key);
  std::string header_bytes(kChunkHeaderBytes, '\0');
  value.Read(0, kChunkHeaderBytes, header_bytes.data());
  return CheckChunk(value.size(), header_bytes,
                    check == PayloadCheck::kChecksum ? value.Pieces(kChunkHeaderBytes, value.size() - kChunkHeaderBytes)
                                                     : std::vector<std::string_view>{},
                    key, check);
}

}  // namespace

void ChunkReader::Read(uint64_t offset, uint64_t length, char* out) const {
  if (host_) {
    host_->Read(offset, length, out);
  } else {
    std::memcpy(out, bytes_.data() + offset, length);
  }
}

std::vector<std::string_view> ChunkReader::Pieces(uint64_t offset, uint64_t length) const {
  if (host_) return host_->Pieces(offset, length);
  return {std::string_view(bytes_).substr(offset, length)};
}

std::string ChunkReader::ReadAll() const {
  std::string out(size(), '\0');
  Read(0, out.size(), out.data());
  return out;
}

absl::Status ChunkWriter::Append(std::string_view bytes) {
  if (written_ + bytes.size() > size_) {
    return absl::InvalidArgumentError(
        absl::StrFormat("payload is longer than header.payload_bytes: %d bytes past the announced %d-byte chunk",
                        written_ + bytes.size() - size_, size_));
  }
  if (direct_to_disk()) {
    direct_.replace(written_, bytes.size(), bytes);
  } else {
    value_->Write(written_, bytes);
  }
  written_ += bytes.size();
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<TieredStore>> TieredStore::Open(const TieredStoreOptions& options,
                                                               std::shared_ptr<CacheMetrics> metrics) {
  if (metrics == nullptr) metrics = std::make_shared<CacheMetrics>();
  ASSIGN_OR_RETURN(auto arena,
                   HostArena::Create(options.host_capacity_bytes, options.page_bytes, options.pin_host_memory,
                                     options.shared_host_memory));
  ASSIGN_OR_RETURN(auto policy, MakeEvictionPolicy(options.eviction_policy, arena->capacity_bytes()));
  std::unique_ptr<DiskTier> disk;
  if (options.disk_capacity_bytes > 0) {
    if (options.data_dir.empty()) return absl::InvalidArgumentError("a disk tier needs a data directory");
    std::error_code ec;
    std::filesystem::create_directories(options.data_dir, ec);
    if (ec) {
      return absl::PermissionDeniedError(
          absl::StrFormat("cannot create data dir %s: %s", options.data_dir, ec.message()));
    }
    ASSIGN_OR_RETURN(disk, DiskTier::Open({.path = options.data_dir,
                                           .capacity_bytes = options.disk_capacity_bytes,
                                           .region_bytes = options.disk_region_bytes,
                                           .scrub_bytes_per_second = options.disk_scrub_bytes_per_second,
                                           .preallocate = options.disk_preallocate}));
  }
  return std::unique_ptr<TieredStore>(
      new TieredStore(options, std::move(arena), std::move(policy), std::move(disk), std::move(metrics)));
}

TieredStore::TieredStore(TieredStoreOptions options, std::unique_ptr<HostArena> arena,
                         std::unique_ptr<EvictionPolicy> policy, std::unique_ptr<DiskTier> disk,
                         std::shared_ptr<CacheMetrics> metrics)
    : options_(std::move(options)),
      arena_(std::move(arena)),
      metrics_(std::move(metrics)),
      policy_(std::move(policy)),
      disk_(std::move(disk)) {
  metrics_->host.capacity->Set(static_cast<double>(arena_->capacity_bytes()));
  if (disk_) {
    metrics_->disk.capacity->Set(static_cast<double>(disk_->capacity_bytes()));
    disk_writer_ = std::thread([this] { DiskWriterLoop(); });
    // A chunk the scrub drops is counted as a corrupt read would be; a host copy of it
    // is no longer on disk (a demotion writes it again).
    disk_->StartScrub([this](const Hash128& key) {
      metrics_->disk.corrupt->Increment();
      MutexLock lock(&mu_);
      if (auto it = host_.find(key); it != host_.end()) it->second.on_disk = false;
      UpdateGaugesLocked();
    });
  }
  MutexLock lock(&mu_);
  UpdateGaugesLocked();
}

TieredStore::~TieredStore() {
  if (disk_) {
    (void)Flush();
    {
      MutexLock lock(&mu_);
      stopping_ = true;
    }
    disk_work_.SignalAll();
    disk_writer_.join();
  }
  MutexLock lock(&mu_);
  host_.clear();  // return every page before the arena goes
}

std::optional<ChunkLocation> TieredStore::Locate(const Hash128& key) const {
  MutexLock lock(&mu_);
  if (auto it = host_.find(key); it != host_.end()) return ChunkLocation{StoreTier::kHost, it->second.value->size()};
  if (disk_) {
    if (auto size = disk_->SizeOf(key)) return ChunkLocation{StoreTier::kDisk, *size};
  }
  return std::nullopt;
}

std::optional<ChunkLocation> TieredStore::Lookup(const Hash128& key) {
  metrics_->lookups->Increment();
  const auto where = Locate(key);
  if (!where) {
    metrics_->misses->Increment();
  } else {
    (where->tier == StoreTier::kHost ? metrics_->host : metrics_->disk).hits->Increment();
  }
  return where;
}

absl::StatusOr<ChunkReader> TieredStore::Read(const Hash128& key, PayloadCheck check) {
  std::shared_ptr<HostValue> value;
  {
    MutexLock lock(&mu_);
    if (auto it = host_.find(key); it != host_.end()) {
      value = it->second.value;
      policy_->Touch(key);
    }
  }
  if (value) {
    const absl::Status checked = CheckHostValue(*value, key, check);
    if (checked.ok()) {
      metrics_->host.bytes_out->Increment(static_cast<double>(value->size()));
      return ChunkReader(StoreTier::kHost, std::move(value));
    }
    metrics_->host.corrupt->Increment();
    spdlog::error("dropping chunk {} from host RAM: {}", key.ToHex(), std::string(checked.message()));
    MutexLock lock(&mu_);
    if (auto it = host_.find(key); it != host_.end() && it->second.value == value) EraseHostLocked(key);
    // The disk copy, if any, is checked on its own below.
  }
  const bool host_copy_corrupt = value != nullptr;
  if (!disk_ || (host_copy_corrupt && !disk_->SizeOf(key))) {
    if (host_copy_corrupt) {
      return absl::DataLossError(absl::StrFormat("chunk %s failed its checksum and was dropped", key.ToHex()));
    }
    return absl::NotFoundError(absl::StrFormat("chunk %s is not stored", key.ToHex()));
  }
  auto bytes = disk_->Get(key);
  if (!bytes.ok()) {
    if (bytes.status().code() == absl::StatusCode::kDataLoss) {
      metrics_->disk.corrupt->Increment();
      spdlog::error("{}", std::string(bytes.status().message()));
      MutexLock lock(&mu_);
      UpdateGaugesLocked();
    }
    return bytes.status();
  }
  metrics_->disk.bytes_out->Increment(static_cast<double>(bytes->size()));
  // Promote: the next read is served from RAM. Without room in time, serve it anyway.
  auto promoted = AllocateHostValue(bytes->size());
  if (promoted.ok()) {
    (*promoted)->Write(0, *bytes);
    LAZYKV_CRASH_POINT("host.promote_before_insert");
    MutexLock lock(&mu_);
    // Only while the disk copy is still there: a chunk deleted or evicted from disk since it
    // was read must not come back as a host copy that claims to be on disk.
    if (!host_.contains(key) && disk_->SizeOf(key)) {
      InsertHostLocked(key, *promoted, /*on_disk=*/true);
      metrics_->promotions->Increment();
    }
  }
  return ChunkReader(StoreTier::kDisk, std::move(*bytes));
}

std::shared_ptr<const HostValue> TieredStore::HostCopy(const Hash128& key) const {
  MutexLock lock(&mu_);
  if (auto it = host_.find(key); it != host_.end()) return it->second.value;
  return nullptr;
}

absl::StatusOr<std::shared_ptr<HostValue>> TieredStore::AllocateHostValue(uint64_t size) {
  const uint64_t pages = arena_->PagesFor(size);
  if (pages > arena_->num_pages()) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "chunk of %d bytes exceeds the host tier's capacity of %d bytes", size, arena_->capacity_bytes()));
  }
  const auto deadline = std::chrono::steady_clock::now() + options_.space_wait;
  std::vector<uint32_t> taken;
  while (true) {
    {
      MutexLock lock(&mu_);
      EvictForLocked(pages, &taken);
      UpdateGaugesLocked();
    }
    if (!taken.empty()) return std::make_shared<HostValue>(arena_.get(), std::move(taken), size);
    if (!arena_->WaitForFreePages(pages, deadline)) {
      metrics_->CountRejected("host_full");
      return absl::ResourceExhaustedError(
          absl::StrFormat("host tier full: %d pages of %d bytes needed, all held by reads and disk writes in progress",
                          pages, arena_->page_bytes()));
    }
  }
}

// Eviction frees only what the put needs, and first from victims whose pages free at once.
// A victim still held by a read or a pending disk write frees its pages only when that
// ends: evicting such victims first could empty the tier for one put. So a first pass
// evicts only victims nobody else holds (the held ones are kept, back in the policy); only
// if that is not enough does a second pass evict held victims, and only until the pages
// they will free cover what is missing; the caller then waits for them.
void TieredStore::EvictForLocked(uint64_t pages, std::vector<uint32_t>* taken) {
  std::vector<std::pair<Hash128, uint64_t>> held;
  while (!arena_->TryAllocate(pages, taken)) {
    const std::optional<Hash128> victim = policy_->PopVictim();
    if (!victim) break;
    auto it = host_.find(*victim);
    if (it == host_.end()) continue;
    if (it->second.value.use_count() > 1 || (disk_ && !it->second.on_disk)) {
      held.emplace_back(*victim, it->second.value->size());
      continue;
    }
    LAZYKV_CRASH_POINT("host.evict_after_choose");  // chosen and out of the policy, not yet freed
    EvictLocked(*victim);
  }
  for (const auto& [key, bytes] : held) policy_->Insert(key, bytes);  // kept: in use
  if (!taken->empty()) return;
  uint64_t freeing_later = 0;
  while (arena_->free_pages() + freeing_later < pages) {
    const std::optional<Hash128> victim = policy_->PopVictim();
    if (!victim) break;
    auto it = host_.find(*victim);
    if (it == host_.end()) continue;
    freeing_later += arena_->PagesFor(it->second.value->size());
    LAZYKV_CRASH_POINT("host.evict_after_choose");
    EvictLocked(*victim);
  }
}

void TieredStore::EvictLocked(const Hash128& victim) {
  auto it = host_.find(victim);
  if (disk_) {
    // Stays on disk: already written through, queued, or written now.
    if (!it->second.on_disk && !it->second.disk_pending) {
      LAZYKV_CRASH_POINT("host.demote_before_enqueue");  // its disk copy was evicted: written again now
      EnqueueDiskWriteLocked(victim, it->second.value);
    }
    metrics_->demotions->Increment();
  }
  metrics_->host.evictions->Increment();
  EraseHostLocked(victim);  // the policy has forgotten it already
}

void TieredStore::InsertHostLocked(const Hash128& key, std::shared_ptr<HostValue> value, bool on_disk) {
  host_used_ += value->size();
  policy_->Insert(key, value->size());
  host_[key] = HostEntry{std::move(value), on_disk, false};
  UpdateGaugesLocked();
}

void TieredStore::EraseHostLocked(const Hash128& key) {
  auto it = host_.find(key);
  if (it == host_.end()) return;
  policy_->Remove(key);
  host_used_ -= it->second.value->size();
  host_.erase(it);
  UpdateGaugesLocked();
}

absl::StatusOr<std::unique_ptr<ChunkWriter>> TieredStore::BeginPut(uint64_t size) {
  if (size > options_.max_chunk_bytes) {
    metrics_->CountRejected("chunk_too_large");
    return absl::ResourceExhaustedError(
        absl::StrFormat("chunk of %d bytes exceeds max_chunk_bytes=%d", size, options_.max_chunk_bytes));
  }
  if (disk_ && arena_->PagesFor(size) > arena_->num_pages()) {
    // Larger than the host tier: buffered on its own, within one budget, for Commit to
    // write straight to disk.
    MutexLock lock(&mu_);
    if (direct_bytes_ + size > options_.max_chunk_bytes) {
      metrics_->CountRejected("host_full");
      return absl::ResourceExhaustedError(absl::StrFormat(
          "chunk of %d bytes is larger than the host tier (%d bytes) and goes straight to disk, but %d bytes of "
          "such chunks are being written (at most max_chunk_bytes=%d at once); retry",
          size, arena_->capacity_bytes(), direct_bytes_, options_.max_chunk_bytes));
    }
    direct_bytes_ += size;
    return std::make_unique<ChunkWriter>(std::string(size, '\0'), [this, size] {
      MutexLock lock(&mu_);
      direct_bytes_ -= size;
    });
  }
  ASSIGN_OR_RETURN(auto value, AllocateHostValue(size));
  return std::make_unique<ChunkWriter>(std::move(value));
}

absl::StatusOr<bool> TieredStore::CommitToDisk(const Hash128& key, ChunkWriter& writer) {
  const std::string_view bytes = writer.direct_;
  RETURN_IF_ERROR(CheckChunk(bytes.size(), bytes.substr(0, kChunkHeaderBytes),
                             {bytes.substr(std::min<size_t>(bytes.size(), kChunkHeaderBytes))}, key));
  {
    MutexLock lock(&mu_);
    if (host_.contains(key) || disk_->SizeOf(key) || direct_writing_.contains(key)) return true;
    direct_writing_.insert(key);  // a Delete of the key waits for this write
  }
  metrics_->bytes_in->Increment(static_cast<double>(bytes.size()));
  auto evicted = disk_->Put(key, {bytes}, bytes.size());
  MutexLock lock(&mu_);
  direct_writing_.erase(key);
  disk_wrote_.SignalAll();
  UpdateGaugesLocked();
  if (!evicted.ok()) return evicted.status();
  return false;
}

absl::StatusOr<bool> TieredStore::Commit(const Hash128& key, std::unique_ptr<ChunkWriter> writer) {
  if (writer->written() != writer->size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "payload is shorter than header.payload_bytes: got %d of %d bytes", writer->written(), writer->size()));
  }
  if (writer->direct_to_disk()) return CommitToDisk(key, *writer);
  RETURN_IF_ERROR(CheckHostValue(*writer->value_, key));
  MutexLock lock(&mu_);
  if (host_.contains(key) || (disk_ && disk_->SizeOf(key))) return true;
  metrics_->bytes_in->Increment(static_cast<double>(writer->size()));
  InsertHostLocked(key, writer->value_, /*on_disk=*/false);
  LAZYKV_CRASH_POINT("host.commit_before_write_through");  // acknowledged once this returns
  if (disk_) EnqueueDiskWriteLocked(key, writer->value_);
  return false;
}

absl::StatusOr<bool> TieredStore::Put(const Hash128& key, std::string_view stored) {
  ASSIGN_OR_RETURN(auto writer, BeginPut(stored.size()));
  RETURN_IF_ERROR(writer->Append(stored));
  return Commit(key, std::move(writer));
}

// A write of the key still queued (its write-through, or a demotion) would put it back on
// disk after the delete, so it is dropped, and one under way is waited for and then deleted.
// A read that promotes the key checks under the lock that its disk copy is still there, so
// the second erase below catches any promotion that slipped in before the disk delete.
bool TieredStore::Delete(const Hash128& key) {
  bool deleted = false;
  {
    MutexLock lock(&mu_);
    if (host_.contains(key)) {
      EraseHostLocked(key);
      deleted = true;
    }
    if (std::erase_if(disk_queue_, [&](const DiskWrite& write) { return write.key == key; }) > 0) deleted = true;
    if (disk_queue_.empty() && disk_in_flight_ == 0) disk_idle_.SignalAll();
    while (disk_writing_ == key || direct_writing_.contains(key)) disk_wrote_.Wait(&mu_);
  }
  if (disk_ && disk_->Delete(key)) deleted = true;
  MutexLock lock(&mu_);
  if (host_.contains(key)) EraseHostLocked(key);
  UpdateGaugesLocked();
  return deleted;
}

void TieredStore::EnqueueDiskWriteLocked(const Hash128& key, std::shared_ptr<HostValue> value) {
  if (auto it = host_.find(key); it != host_.end()) it->second.disk_pending = true;
  disk_queue_.push_back(DiskWrite{key, std::move(value)});
  metrics_->pending_disk_writes->Set(static_cast<double>(disk_queue_.size() + disk_in_flight_));
  disk_work_.Signal();
}

void TieredStore::DiskWriterLoop() {
  MutexLock lock(&mu_);
  while (true) {
    while (!stopping_ && disk_queue_.empty()) disk_work_.Wait(&mu_);
    if (disk_queue_.empty()) return;  // stopping, and nothing left to write
    DiskWrite write = std::move(disk_queue_.front());
    disk_queue_.pop_front();
    ++disk_in_flight_;
    disk_writing_ = write.key;
    lock.Unlock();
    LAZYKV_CRASH_POINT("writer.before_disk_put");  // a write-through or a demotion, off the queue
    auto evicted = disk_->Put(write.key, write.value->Pieces(0, write.value->size()), write.value->size());
    LAZYKV_CRASH_POINT("writer.after_disk_put");
    if (!evicted.ok())
      spdlog::error("disk write of chunk {} failed: {}", write.key.ToHex(), std::string(evicted.status().message()));
    write.value.reset();  // the pages of an already-evicted value go back now
    lock.Lock();
    --disk_in_flight_;
    disk_writing_.reset();
    disk_wrote_.SignalAll();
    if (auto it = host_.find(write.key); it != host_.end()) {
      it->second.disk_pending = false;
      it->second.on_disk = evicted.ok();
    }
    if (evicted.ok()) {
      for (const Hash128& gone : *evicted) {
        metrics_->disk.evictions->Increment();
        if (auto it = host_.find(gone); it != host_.end()) it->second.on_disk = false;
      }
    }
    UpdateGaugesLocked();
    if (disk_queue_.empty() && disk_in_flight_ == 0) disk_idle_.SignalAll();
  }
}

absl::Status TieredStore::Flush() {
  if (!disk_) return absl::OkStatus();
  {
    MutexLock lock(&mu_);
    while (!disk_queue_.empty() || disk_in_flight_ != 0) disk_idle_.Wait(&mu_);
  }
  return disk_->Flush();
}

void TieredStore::UpdateGaugesLocked() {
  metrics_->host.occupancy->Set(static_cast<double>(host_used_));
  metrics_->host.entries->Set(static_cast<double>(host_.size()));
  metrics_->pending_disk_writes->Set(static_cast<double>(disk_queue_.size() + disk_in_flight_));
  if (disk_) {
    metrics_->disk.occupancy->Set(static_cast<double>(disk_->used_bytes()));
    metrics_->disk.entries->Set(static_cast<double>(disk_->entries()));
  }
}

TieredStoreStats TieredStore::stats() const {
  MutexLock lock(&mu_);
  TieredStoreStats s;
  s.host_capacity = arena_->capacity_bytes();
  s.host_used = host_used_;
  s.host_entries = host_.size();
  s.host_pinned = arena_->pinned();
  s.pending_disk_writes = disk_queue_.size() + disk_in_flight_;
  if (disk_) {
    s.disk_capacity = disk_->capacity_bytes();
    s.disk_used = disk_->used_bytes();
    s.disk_entries = disk_->entries();
  }
  return s;
}

}  // namespace lazykv::cache
