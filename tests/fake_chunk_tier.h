// A ChunkTier in memory for pipeline and engine tests, with single-flight leases and
// faults on demand: slow (delays on every call), hung (a lease held by a holder that
// never publishes), full (publications refused), corrupt (fetches fail DATA_LOSS, or
// return flipped bytes), dying (fetches fail UNAVAILABLE after their delay).
// Thread-safe, as every ChunkTier must be. It records what it was asked.
#pragma once

#include <chrono>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/chunk_codec.h"
#include "common/mutex.h"
#include "worker/tier/chunk_tier.h"

namespace lazykv::testing {

class FakeChunkTier final : public ChunkTier {
 public:
  struct Faults {
    std::chrono::milliseconds lookup_delay{0};
    std::chrono::milliseconds fetch_delay{0};
    std::chrono::milliseconds lease_delay{0};
    std::chrono::milliseconds publish_delay{0};
    bool full = false;           // Publish: RESOURCE_EXHAUSTED
    bool corrupt = false;        // Fetch: DATA_LOSS
    bool flip_bytes = false;     // Fetch: the stored bytes with one payload byte flipped (unverified)
    bool dies_in_fetch = false;  // Fetch: UNAVAILABLE after fetch_delay
  };
  struct Published {
    Hash128 key;
    std::string stored;
    uint64_t lease_id = 0;
  };

  void SetFaults(const Faults& faults) {
    MutexLock lock(&mu_);
    faults_ = faults;
  }
  void Store(const Hash128& key, std::string stored) {
    MutexLock lock(&mu_);
    stored_[key] = std::move(stored);
    leases_.erase(key);
    changed_.SignalAll();
  }
  // Another worker holds the lease on `key` and never publishes; it says `ttl` is left,
  // and renews it for ever (a squatter).
  void HoldForever(const Hash128& key, std::chrono::milliseconds ttl) {
    MutexLock lock(&mu_);
    leases_[key] = HeldLease{next_lease_++, ttl, std::chrono::steady_clock::time_point::max()};
  }

  std::vector<std::optional<TierHit>> Lookup(std::span<const Hash128> keys) override {
    std::this_thread::sleep_for(GetFaults().lookup_delay);
    MutexLock lock(&mu_);
    std::vector<std::optional<TierHit>> hits;
    for (const Hash128& key : keys) {
      auto it = stored_.find(key);
      if (it == stored_.end()) {
        hits.emplace_back();
      } else {
        hits.push_back(TierHit{ChunkSource::kHost, it->second.size(), "", ""});
      }
    }
    return hits;
  }

  absl::StatusOr<FetchedChunk> Fetch(const Hash128& key) override {
    const Faults faults = GetFaults();
    std::this_thread::sleep_for(faults.fetch_delay);
    MutexLock lock(&mu_);
    ++fetches_;
    if (faults.dies_in_fetch) return absl::UnavailableError("connection reset mid-fetch");
    if (faults.corrupt) return absl::DataLossError(absl::StrCat("chunk ", key.ToHex(), " failed its checksum"));
    auto it = stored_.find(key);
    if (it == stored_.end()) return absl::NotFoundError("not stored");
    std::string bytes = it->second;
    if (faults.flip_bytes && !bytes.empty()) bytes.back() ^= 0x5a;
    return FetchedChunk{ChunkBytes::FromString(std::move(bytes)), ChunkSource::kHost, ""};
  }

  // Single flight: stored, granted, or (held by another) waits up to `wait` for a
  // publication or release, as the cache server does.
  LeaseAnswer Lease(const Hash128& key, std::chrono::milliseconds ttl, std::chrono::milliseconds wait) override {
    std::this_thread::sleep_for(GetFaults().lease_delay);
    const auto deadline = std::chrono::steady_clock::now() + wait;
    MutexLock lock(&mu_);
    while (true) {
      if (stored_.contains(key)) return LeaseAnswer{LeaseAnswer::State::kStored, 0, {}};
      auto it = leases_.find(key);
      const auto now = std::chrono::steady_clock::now();
      if (it == leases_.end() || it->second.expiry <= now) {  // free, or its holder's TTL ran out
        const uint64_t id = next_lease_++;
        leases_[key] = HeldLease{id, ttl, now + ttl};
        ++grants_;
        granted_ttls_.push_back(ttl);
        return LeaseAnswer{LeaseAnswer::State::kGranted, id, ttl};
      }
      if (now >= deadline) return LeaseAnswer{LeaseAnswer::State::kHeld, it->second.id, it->second.ttl};
      changed_.WaitUntil(&mu_, std::min(deadline, it->second.expiry));  // then look again
    }
  }

  void ReleaseLease(const Hash128& key, uint64_t lease_id) override {
    MutexLock lock(&mu_);
    released_.push_back(lease_id);
    if (auto it = leases_.find(key); it != leases_.end() && it->second.id == lease_id) leases_.erase(it);
    changed_.SignalAll();
  }

  absl::Status RenewLease(const Hash128& key, uint64_t lease_id, std::chrono::milliseconds ttl) override {
    std::this_thread::sleep_for(GetFaults().lease_delay);
    MutexLock lock(&mu_);
    auto it = leases_.find(key);
    const auto now = std::chrono::steady_clock::now();
    if (it == leases_.end() || it->second.id != lease_id || it->second.expiry <= now) {
      return absl::NotFoundError("lease lost");
    }
    it->second.expiry = now + ttl;
    ++renewals_;
    return absl::OkStatus();
  }

  // Drops the reported version, except for a checksum report: as a cache server does, the
  // fake judges its own copy (never corrupt here: flip_bytes breaks the bytes on the way).
  void ReportInvalid(const Hash128& key, std::string_view header, std::string_view reason) override {
    MutexLock lock(&mu_);
    reports_.push_back(std::string(reason));
    if (reason == "checksum") return;
    auto it = stored_.find(key);
    if (header.size() == kChunkHeaderBytes && it != stored_.end() &&
        std::string_view(it->second).substr(0, header.size()) == header) {
      stored_.erase(it);
    }
  }

  absl::Status Publish(const Hash128& key, const Hash128& model_fingerprint, std::string_view stored,
                       uint64_t lease_id) override {
    const Faults faults = GetFaults();
    std::this_thread::sleep_for(faults.publish_delay);
    MutexLock lock(&mu_);
    if (faults.full) return absl::ResourceExhaustedError("host tier full");
    published_.push_back(Published{key, std::string(stored), lease_id});
    stored_[key] = std::string(stored);
    leases_.erase(key);
    changed_.SignalAll();
    return absl::OkStatus();
  }

  std::string Describe() const override { return "fake"; }

  std::vector<Published> published() const {
    MutexLock lock(&mu_);
    return published_;
  }
  std::vector<uint64_t> released() const {
    MutexLock lock(&mu_);
    return released_;
  }
  int grants() const {
    MutexLock lock(&mu_);
    return grants_;
  }
  int fetches() const {
    MutexLock lock(&mu_);
    return fetches_;
  }
  int renewals() const {
    MutexLock lock(&mu_);
    return renewals_;
  }
  std::vector<std::chrono::milliseconds> granted_ttls() const {
    MutexLock lock(&mu_);
    return granted_ttls_;
  }
  std::vector<std::string> reports() const {  // ReportInvalid reasons, in order
    MutexLock lock(&mu_);
    return reports_;
  }
  // Whether a lease on `key` is held and unexpired.
  bool leased(const Hash128& key) const {
    MutexLock lock(&mu_);
    auto it = leases_.find(key);
    return it != leases_.end() && it->second.expiry > std::chrono::steady_clock::now();
  }
  // Leases granted and neither published nor released (a leak once the work is done).
  size_t outstanding_leases() const {
    MutexLock lock(&mu_);
    return leases_.size();
  }
  bool stored(const Hash128& key) const {
    MutexLock lock(&mu_);
    return stored_.contains(key);
  }

 private:
  struct HeldLease {
    uint64_t id = 0;
    std::chrono::milliseconds ttl{0};
    std::chrono::steady_clock::time_point expiry;
  };
  Faults GetFaults() const {
    MutexLock lock(&mu_);
    return faults_;
  }

  mutable Mutex mu_;
  CondVar changed_;  // a chunk was stored or a lease released
  Faults faults_ ABSL_GUARDED_BY(mu_);
  std::unordered_map<Hash128, std::string, Hash128Hasher> stored_ ABSL_GUARDED_BY(mu_);
  std::unordered_map<Hash128, HeldLease, Hash128Hasher> leases_ ABSL_GUARDED_BY(mu_);
  uint64_t next_lease_ ABSL_GUARDED_BY(mu_) = 1;
  std::vector<Published> published_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> released_ ABSL_GUARDED_BY(mu_);
  int grants_ ABSL_GUARDED_BY(mu_) = 0;
  int fetches_ ABSL_GUARDED_BY(mu_) = 0;
  int renewals_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::chrono::milliseconds> granted_ttls_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> reports_ ABSL_GUARDED_BY(mu_);
};

}  // namespace lazykv::testing
