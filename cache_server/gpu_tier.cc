#include "cache_server/gpu_tier.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "absl/strings/str_format.h"

namespace lazykv::cache {

absl::StatusOr<std::string> GpuValue::ReadAll() const {
  std::string bytes(size_, '\0');
  absl::Status s = arena_->Read(pages_, 0, size_, bytes.data());
  if (!s.ok()) return s;
  return bytes;
}

absl::StatusOr<std::unique_ptr<GpuTier>> GpuTier::Create(const GpuTierOptions& options,
                                                         std::shared_ptr<CacheMetrics> metrics,
                                                         std::function<bool(const Hash128&)> stored_below,
                                                         std::function<void(const Hash128&, std::string)> demote) {
  absl::StatusOr<std::unique_ptr<DeviceArena>> arena =
      options.emulate ? DeviceArena::CreateEmulated(options.capacity_bytes, options.page_bytes)
                      : DeviceArena::CreateOnGpu(options.capacity_bytes, options.page_bytes, options.device);
  if (!arena.ok()) return arena.status();
  auto policy = MakeEvictionPolicy(options.eviction_policy, (*arena)->capacity_bytes());
  if (!policy.ok()) return policy.status();
  return std::unique_ptr<GpuTier>(new GpuTier(options, *std::move(arena), *std::move(policy), std::move(metrics),
                                              std::move(stored_below), std::move(demote)));
}

GpuTier::GpuTier(const GpuTierOptions& options, std::shared_ptr<DeviceArena> arena,
                 std::unique_ptr<EvictionPolicy> policy, std::shared_ptr<CacheMetrics> metrics,
                 std::function<bool(const Hash128&)> stored_below,
                 std::function<void(const Hash128&, std::string)> demote)
    : options_(options),
      arena_(std::move(arena)),
      metrics_(std::move(metrics)),
      stored_below_(std::move(stored_below)),
      demote_(std::move(demote)),
      policy_(std::move(policy)) {
  {
    MutexLock lock(&mu_);
    UpdateGaugesLocked();
  }
  promoter_ = std::thread([this] { PromoterLoop(); });
}

GpuTier::~GpuTier() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    pending_.clear();
    work_.SignalAll();
  }
  promoter_.join();
  MutexLock lock(&mu_);
  index_.clear();  // values no lease holds free their pages now
}

std::shared_ptr<const GpuValue> GpuTier::Find(const Hash128& key) {
  MutexLock lock(&mu_);
  auto it = index_.find(key);
  if (it == index_.end()) return nullptr;
  policy_->Touch(key);
  return it->second;
}

bool GpuTier::Contains(const Hash128& key) const {
  MutexLock lock(&mu_);
  return index_.contains(key);
}

bool GpuTier::WouldQueueLocked(const Hash128& key, uint64_t bytes) const {
  if (arena_->PagesFor(bytes) > arena_->num_pages()) return false;
  if (stopping_ || index_.contains(key) || pending_.size() >= options_.max_pending_promotions) return false;
  return std::none_of(pending_.begin(), pending_.end(), [&](const Pending& p) { return p.key == key; });
}

bool GpuTier::WouldQueue(const Hash128& key, uint64_t bytes) const {
  MutexLock lock(&mu_);
  return WouldQueueLocked(key, bytes);
}

void GpuTier::RequestPromotion(const Hash128& key, ChunkReader chunk) {
  MutexLock lock(&mu_);
  if (!WouldQueueLocked(key, chunk.size())) return;
  pending_.push_back(Pending{key, std::move(chunk)});
  counts_.pending_promotions = pending_.size();
  work_.Signal();
}

void GpuTier::PromoterLoop() {
  MutexLock lock(&mu_);
  while (true) {
    while (!stopping_ && pending_.empty()) {
      idle_.SignalAll();
      work_.Wait(&mu_);
    }
    if (stopping_) break;
    std::optional<Pending> next(std::move(pending_.front()));
    pending_.pop_front();
    counts_.pending_promotions = pending_.size();
    // In flight from here, under the lock that unqueued it: a Delete between the two (the key
    // neither queued nor in flight) found nothing to stop, and the chunk came back.
    const bool claimed = ClaimLocked(next->key);
    promoting_ = true;
    lock.Unlock();
    Demotions demote;
    if (claimed) {
      if (absl::Status s = PromoteClaimed(next->key, next->chunk, &demote); !s.ok()) {
        spdlog::debug("GPU tier: promotion of {} skipped: {}", next->key.ToHex(), s.ToString());
      }
    }
    next.reset();  // its host pages go back before the demotions need room there
    Demote(std::move(demote));
    lock.Lock();
    promoting_ = false;
  }
  idle_.SignalAll();
}

void GpuTier::WaitForPromotions() {
  MutexLock lock(&mu_);
  while (!stopping_ && (!pending_.empty() || promoting_)) idle_.Wait(&mu_);
}

void GpuTier::EvictForLocked(uint64_t pages, Victims* victims) {
  // A victim a reader holds leaves the index, but its pages come back only when the reader
  // lets go: count only the others' pages as freed.
  // Bounded: where readers hold most pages, a promotion gives up after evicting a few times
  // what it needs rather than emptying the tier.
  uint64_t freeing = 0, evicted = 0;
  while (arena_->free_pages() + freeing < pages && evicted < 4 * pages + 16) {
    const std::optional<Hash128> victim = policy_->PopVictim();
    if (!victim) return;
    auto it = index_.find(*victim);
    if (it == index_.end()) continue;
    if (it->second.use_count() == 1) freeing += it->second->pages().size();
    evicted += it->second->pages().size();
    used_ -= it->second->size();
    victims->emplace_back(*victim, std::move(it->second));
    index_.erase(it);
    ++counts_.evictions;
    metrics_->gpu.evictions->Increment();
  }
}

void GpuTier::ReadBackOrDrop(Victims victims, Demotions* demote) {
  for (auto& [key, value] : victims) {
    if (stored_below_ != nullptr && !stored_below_(key)) {  // the only copy: keep its bytes
      absl::StatusOr<std::string> bytes = value->ReadAll();
      if (bytes.ok()) {
        {
          MutexLock lock(&mu_);
          in_flight_.insert(key);  // a Delete until its demotion leaves a tombstone
        }
        demote->emplace_back(key, *std::move(bytes));
      } else {
        spdlog::warn("GPU tier: reading back {} failed ({}); the chunk is lost", key.ToHex(),
                     bytes.status().ToString());
      }
    }
    value.reset();  // its pages go back (unless a reader holds them)
  }
}

void GpuTier::Demote(Demotions demote) {
  for (auto& [key, bytes] : demote) {
    {
      MutexLock lock(&mu_);
      in_flight_.erase(key);
      if (tombstones_.erase(key) > 0) continue;  // deleted since its eviction
    }
    demote_(key, std::move(bytes));
    MutexLock lock(&mu_);
    ++counts_.demotions;
    metrics_->gpu_demotions->Increment();
  }
}

absl::Status GpuTier::Promote(const Hash128& key, const ChunkReader& chunk) {
  Demotions demote;
  absl::Status status = PromoteInto(key, chunk, &demote);
  Demote(std::move(demote));
  return status;
}

bool GpuTier::ClaimLocked(const Hash128& key) {
  if (index_.contains(key) || in_flight_.contains(key)) return false;
  in_flight_.insert(key);
  return true;
}

absl::Status GpuTier::PromoteInto(const Hash128& key, const ChunkReader& chunk, Demotions* demote) {
  {
    MutexLock lock(&mu_);
    if (!ClaimLocked(key)) return absl::OkStatus();  // stored, or under way
  }
  return PromoteClaimed(key, chunk, demote);
}

absl::Status GpuTier::PromoteClaimed(const Hash128& key, const ChunkReader& chunk, Demotions* demote) {
  // However it ends, the key is no longer in flight (and a tombstone for it is spent).
  struct Landed {
    GpuTier* tier;
    Hash128 key;
    ~Landed() {
      MutexLock lock(&tier->mu_);
      tier->in_flight_.erase(key);
      tier->tombstones_.erase(key);
    }
  } landed{this, key};
  const uint64_t size = chunk.size();
  if (size < kChunkHeaderBytes) return absl::InvalidArgumentError("GPU tier: not a stored chunk");
  const uint64_t pages_needed = arena_->PagesFor(size);
  if (pages_needed > arena_->num_pages()) {
    return absl::ResourceExhaustedError(absl::StrFormat("chunk of %d bytes is larger than the GPU tier", size));
  }
  std::vector<uint32_t> pages;
  Victims victims;
  {
    MutexLock lock(&mu_);
    EvictForLocked(pages_needed, &victims);
    UpdateGaugesLocked();
  }
  ReadBackOrDrop(std::move(victims), demote);  // the victims' pages go back here
  if (!arena_->TryAllocate(pages_needed, &pages)) {
    return absl::ResourceExhaustedError("GPU tier: no room (pages held by readers)");
  }
  std::string header(kChunkHeaderBytes, '\0');
  chunk.Read(0, kChunkHeaderBytes, header.data());
  auto value = std::make_shared<GpuValue>(arena_, std::move(pages), size, std::move(header));
  uint64_t offset = 0;
  for (std::string_view piece : chunk.Pieces(0, size)) {
    if (absl::Status s = arena_->Write(value->pages(), offset, piece); !s.ok()) return s;
    offset += piece.size();
  }
  MutexLock lock(&mu_);
  // Dropped (its pages go back): stopping, stored meanwhile, or deleted while it was copied.
  if (stopping_ || index_.contains(key) || tombstones_.contains(key)) return absl::OkStatus();
  index_.emplace(key, std::move(value));
  policy_->Insert(key, size);
  used_ += size;
  ++counts_.promotions;
  metrics_->gpu_promotions->Increment();
  UpdateGaugesLocked();
  return absl::OkStatus();
}

bool GpuTier::Delete(const Hash128& key) {
  std::shared_ptr<const GpuValue> dropped;  // its pages go back after the lock
  std::optional<Pending> unqueued;          // and a queued promotion's reader
  MutexLock lock(&mu_);
  for (auto p = pending_.begin(); p != pending_.end(); ++p) {
    if (p->key == key) {
      unqueued.emplace(std::move(*p));
      pending_.erase(p);
      counts_.pending_promotions = pending_.size();
      break;
    }
  }
  if (in_flight_.contains(key)) tombstones_.insert(key);
  auto it = index_.find(key);
  if (it == index_.end()) return false;
  dropped = std::move(it->second);
  used_ -= dropped->size();
  index_.erase(it);
  policy_->Remove(key);
  UpdateGaugesLocked();
  return true;
}

GpuTierStats GpuTier::stats() const {
  MutexLock lock(&mu_);
  GpuTierStats s = counts_;
  s.capacity = arena_->capacity_bytes();
  s.used = used_;
  s.entries = index_.size();
  return s;
}

void GpuTier::UpdateGaugesLocked() {
  metrics_->gpu.occupancy->Set(static_cast<double>(used_));
  metrics_->gpu.capacity->Set(static_cast<double>(arena_->capacity_bytes()));
  metrics_->gpu.entries->Set(static_cast<double>(index_.size()));
}

}  // namespace lazykv::cache
