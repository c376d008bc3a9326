#include "cache_server/eviction_policy.h"

#include "absl/strings/str_format.h"

namespace lazykv::cache {

absl::StatusOr<std::unique_ptr<EvictionPolicy>> MakeEvictionPolicy(std::string_view name, uint64_t capacity_bytes) {
  if (name == "s3fifo") return std::make_unique<S3FifoPolicy>(capacity_bytes);
  if (name == "lru") return std::make_unique<LruPolicy>();
  return absl::InvalidArgumentError(absl::StrFormat("unknown eviction policy '%s' (s3fifo, lru)", std::string(name)));
}

void LruPolicy::Insert(const Hash128& key, uint64_t) {
  Remove(key);
  order_.push_front(key);
  where_[key] = order_.begin();
}

void LruPolicy::Touch(const Hash128& key) {
  auto it = where_.find(key);
  if (it != where_.end()) order_.splice(order_.begin(), order_, it->second);
}

void LruPolicy::Remove(const Hash128& key) {
  auto it = where_.find(key);
  if (it == where_.end()) return;
  order_.erase(it->second);
  where_.erase(it);
}

std::optional<Hash128> LruPolicy::PopVictim() {
  if (order_.empty()) return std::nullopt;
  const Hash128 victim = order_.back();
  order_.pop_back();
  where_.erase(victim);
  return victim;
}

S3FifoPolicy::S3FifoPolicy(uint64_t capacity_bytes)
    : small_target_(capacity_bytes / 10), ghost_target_(capacity_bytes - capacity_bytes / 10) {}

void S3FifoPolicy::Enqueue(const Hash128& key, Entry& entry, Queue q) {
  entry.queue = q;
  QueueOf(q).push_front(key);
  entry.pos = QueueOf(q).begin();
  if (q == Queue::kSmall) small_bytes_ += entry.bytes;
}

void S3FifoPolicy::Dequeue(Entry& entry) {
  QueueOf(entry.queue).erase(entry.pos);
  if (entry.queue == Queue::kSmall) small_bytes_ -= entry.bytes;
}

void S3FifoPolicy::RememberGhost(const Hash128& key, uint64_t bytes) {
  ghost_.emplace_front(key, bytes);
  ghost_where_[key] = ghost_.begin();
  ghost_bytes_ += bytes;
  while (ghost_bytes_ > ghost_target_ && !ghost_.empty()) {
    ghost_bytes_ -= ghost_.back().second;
    ghost_where_.erase(ghost_.back().first);
    ghost_.pop_back();
  }
}

void S3FifoPolicy::Insert(const Hash128& key, uint64_t bytes) {
  Remove(key);
  Queue q = Queue::kSmall;
  if (auto ghost = ghost_where_.find(key); ghost != ghost_where_.end()) {
    q = Queue::kMain;  // came back soon after leaving: it is not a one-time document
    ghost_bytes_ -= ghost->second->second;
    ghost_.erase(ghost->second);
    ghost_where_.erase(ghost);
  }
  Entry& entry = entries_[key];
  entry.bytes = bytes;
  entry.freq = 0;
  Enqueue(key, entry, q);
}

void S3FifoPolicy::Touch(const Hash128& key) {
  auto it = entries_.find(key);
  if (it != entries_.end()) it->second.freq = std::min(it->second.freq + 1, 3);
}

void S3FifoPolicy::Remove(const Hash128& key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return;
  Dequeue(it->second);
  entries_.erase(it);
}

std::optional<Hash128> S3FifoPolicy::PopVictim() {
  while (!entries_.empty()) {
    const bool from_small = !small_.empty() && (small_bytes_ >= small_target_ || main_.empty());
    std::list<Hash128>& queue = from_small ? small_ : main_;
    const Hash128 key = queue.back();
    Entry& entry = entries_.at(key);
    if (entry.freq > 0) {
      // Read since it arrived (small) or since its last pass (main): keep it, in main.
      Dequeue(entry);
      if (!from_small)
        entry.freq -= 1;
      else
        entry.freq = 0;
      Enqueue(key, entry, Queue::kMain);
      continue;
    }
    Dequeue(entry);
    if (from_small) RememberGhost(key, entry.bytes);
    entries_.erase(key);
    return key;
  }
  return std::nullopt;
}

}  // namespace lazykv::cache
