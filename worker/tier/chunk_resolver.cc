#include "worker/tier/chunk_resolver.h"

#include <spdlog/spdlog.h>

namespace lazykv {

ChunkResolver::ChunkResolver(std::unique_ptr<ChunkTier> tier, ResolverOptions options)
    : tier_(std::move(tier)), options_(options), publisher_([this] { PublisherLoop(); }) {}

ChunkResolver::~ChunkResolver() {
  Flush();
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  work_.SignalAll();
  publisher_.join();
}

std::optional<FetchedChunk> ChunkResolver::TryFetch(const Hash128& key) {
  auto fetched = tier_->Fetch(key);
  MutexLock lock(&mu_);
  if (!fetched.ok()) {
    ++stats_.fetch_failures;
    // Not found: evicted since the lookup. Unavailable: a down server, logged by the tier.
    if (fetched.status().code() != absl::StatusCode::kNotFound &&
        fetched.status().code() != absl::StatusCode::kUnavailable) {
      spdlog::warn("fetch of chunk {} failed, computing it: {}", key.ToHex(), std::string(fetched.status().message()));
    }
    return std::nullopt;
  }
  ++stats_.fetched;
  return *std::move(fetched);
}

ChunkResolver::Decision ChunkResolver::Compute(uint64_t lease_id) {
  MutexLock lock(&mu_);
  ++stats_.computed;
  return Decision{std::nullopt, lease_id};
}

ChunkResolver::Decision ChunkResolver::Resolve(const Hash128& key, const std::optional<TierHit>& hint) {
  if (hint) {
    if (auto fetched = TryFetch(key)) return Decision{std::move(fetched), 0};
  }
  const auto give_up_at = std::chrono::steady_clock::now() + options_.max_wait;
  std::chrono::milliseconds wait{0};
  while (true) {
    const LeaseAnswer answer = tier_->Lease(key, options_.lease_ttl, wait);
    switch (answer.state) {
      case LeaseAnswer::State::kGranted:
      case LeaseAnswer::State::kUnavailable:
        return Compute(answer.lease_id);
      case LeaseAnswer::State::kStored:
        if (auto fetched = TryFetch(key)) return Decision{std::move(fetched), 0};
        return Compute(0);  // stored but unreadable: compute, do not publish
      case LeaseAnswer::State::kHeld: {
        const auto now = std::chrono::steady_clock::now();
        if (now >= give_up_at) return Compute(0);  // waited long enough: the holder publishes
        if (wait.count() == 0) {
          MutexLock lock(&mu_);
          ++stats_.lease_waits;
        }
        // Wait for the publication, or past the lease's expiry (then it is granted to us).
        wait = std::min(answer.remaining + std::chrono::milliseconds(50),
                        std::chrono::duration_cast<std::chrono::milliseconds>(give_up_at - now));
        break;
      }
    }
  }
}

void ChunkResolver::PublishAsync(const Hash128& key, const Hash128& model_fingerprint, std::string stored,
                                 uint64_t lease_id) {
  {
    MutexLock lock(&mu_);
    queue_.push_back(Publication{key, model_fingerprint, std::move(stored), lease_id});
  }
  work_.Signal();
}

void ChunkResolver::PublisherLoop() {
  MutexLock lock(&mu_);
  while (true) {
    while (!stopping_ && queue_.empty()) work_.Wait(&mu_);
    if (queue_.empty()) return;
    Publication p = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lock.Unlock();
    const absl::Status status = tier_->Publish(p.key, p.fingerprint, p.stored, p.lease_id);
    if (!status.ok()) {
      // A down server is logged once by the tier, not once per chunk.
      if (status.code() == absl::StatusCode::kUnavailable) {
        spdlog::debug("publishing chunk {} failed: {}", p.key.ToHex(), std::string(status.message()));
      } else {
        spdlog::warn("publishing chunk {} failed: {}", p.key.ToHex(), std::string(status.message()));
      }
      if (p.lease_id != 0) tier_->ReleaseLease(p.key, p.lease_id);  // let a waiter compute it
    }
    lock.Lock();
    busy_ = false;
    ++(status.ok() ? stats_.published : stats_.publish_failures);
    if (queue_.empty()) idle_.SignalAll();
  }
}

void ChunkResolver::Flush() {
  MutexLock lock(&mu_);
  while (!queue_.empty() || busy_) idle_.Wait(&mu_);
}

ResolverStats ChunkResolver::stats() const {
  MutexLock lock(&mu_);
  return stats_;
}

}  // namespace lazykv
