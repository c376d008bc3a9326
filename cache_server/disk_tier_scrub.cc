// DiskTier's scrub (disk_tier.h): every indexed chunk read back and checked at a bounded
// rate, region after region, and RocksDB's whole-file checksums verified after each pass.
#include <rocksdb/db.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>

#include "cache_server/disk_tier.h"

namespace lazykv::cache {

void DiskTier::StartScrub(std::function<void(const Hash128&)> on_drop) {
  on_scrub_drop_ = std::move(on_drop);
  if (scrub_rate_ > 0 && !scrub_thread_.joinable()) scrub_thread_ = std::thread([this] { ScrubLoop(); });
}

bool DiskTier::ScrubRegion(uint32_t region, const std::function<bool(uint64_t)>& keep_going, uint64_t* dropped) {
  std::vector<std::pair<Hash128, Entry>> todo;
  {
    MutexLock lock(&mu_);
    for (const auto& [key, offset] : regions_[region].chunks) {
      if (file_->RegionOf(offset) != region) continue;  // scrubbed with the region it starts in
      auto it = index_.find(key);
      if (it != index_.end() && it->second.offset == offset) todo.emplace_back(key, it->second);
    }
  }
  for (const auto& [key, entry] : todo) {
    bool was_dropped = false;
    const auto checked = ReadChecked(key, entry, /*from_scrub=*/true, &was_dropped);
    if (was_dropped) {
      ++*dropped;
      spdlog::error("scrub: {}", std::string(checked.status().message()));
      if (on_scrub_drop_) on_scrub_drop_(key);
    }
    if (!keep_going(entry.size)) return false;
  }
  return true;
}

void DiskTier::VerifyIndexFiles() {
  const rocksdb::Status s = db_->VerifyFileChecksums(rocksdb::ReadOptions());
  if (s.ok()) return;
  spdlog::error("scrub: the disk tier's index fails its file checksums: {}", s.ToString());
  MutexLock lock(&mu_);
  ++counters_.index_check_failures;
}

uint64_t DiskTier::ScrubPass() {
  uint64_t dropped = 0;
  for (uint32_t r = 0; r < file_->geometry().regions; ++r)
    ScrubRegion(
        r, [](uint64_t) { return true; }, &dropped);
  VerifyIndexFiles();
  MutexLock lock(&mu_);
  ++counters_.scrub_passes;
  return dropped;
}

void DiskTier::ScrubLoop() {
  using Clock = std::chrono::steady_clock;
  Clock::time_point next = Clock::now();
  // Paces reads at scrub_rate_: each read of `bytes` moves the next start later; false
  // when the tier is closing.
  auto pace = [&](uint64_t bytes) {
    next = std::max(next, Clock::now() - std::chrono::seconds(1)) +  // no catching up after idle time
           std::chrono::duration_cast<Clock::duration>(
               std::chrono::duration<double>(static_cast<double>(bytes) / static_cast<double>(scrub_rate_)));
    MutexLock lock(&scrub_mu_);
    while (!stopping_ && Clock::now() < next) scrub_wake_.WaitUntil(&scrub_mu_, next);
    return !stopping_;
  };
  const uint32_t regions = file_->geometry().regions;
  uint32_t region = 0;
  uint64_t dropped = 0, read_before = 0;
  while (true) {
    if (!ScrubRegion(region, pace, &dropped)) return;
    if (++region < regions) continue;
    region = 0;
    VerifyIndexFiles();
    uint64_t read_now = 0;
    {
      MutexLock lock(&mu_);
      ++counters_.scrub_passes;
      read_now = counters_.scrubbed_bytes;
    }
    // A pass that found little to read waits as long as reading a second's worth would take.
    const bool idle = read_now - read_before < scrub_rate_;
    read_before = read_now;
    if (idle && !pace(scrub_rate_)) return;
  }
}

}  // namespace lazykv::cache
