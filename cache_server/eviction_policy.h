// Which host-tier entry leaves first. The default is S3-FIFO (Yang et al., SOSP 2023):
// new entries enter a small FIFO (10% of the bytes); an entry read again while there
// moves to the main FIFO, the rest leave early, remembered in a ghost FIFO of keys so
// that a quick return goes straight to main. Main re-queues entries read since their
// last pass (a 2-bit counter). Under Zipf popularity this keeps the hot documents that
// LRU loses to bursts of one-time documents; bench/eviction_policy_bench.cc measures it
// against LRU on the same trace.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <string_view>
#include <unordered_map>

#include "absl/status/statusor.h"
#include "common/chunk_key.h"

namespace lazykv::cache {

// Not thread-safe: the TieredStore calls it under its own lock.
class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  virtual void Insert(const Hash128& key, uint64_t bytes) = 0;
  virtual void Touch(const Hash128& key) = 0;   // a read
  virtual void Remove(const Hash128& key) = 0;  // deleted outside the policy
  // Picks the next entry to leave and forgets it; nullopt when empty.
  virtual std::optional<Hash128> PopVictim() = 0;
  virtual size_t size() const = 0;
};

// "s3fifo" (default) or "lru"; capacity is the tier's bytes (S3-FIFO sizes its queues by it).
absl::StatusOr<std::unique_ptr<EvictionPolicy>> MakeEvictionPolicy(std::string_view name, uint64_t capacity_bytes);

class LruPolicy final : public EvictionPolicy {
 public:
  void Insert(const Hash128& key, uint64_t bytes) override;
  void Touch(const Hash128& key) override;
  void Remove(const Hash128& key) override;
  std::optional<Hash128> PopVictim() override;
  size_t size() const override { return where_.size(); }

 private:
  std::list<Hash128> order_;  // front: most recent
  std::unordered_map<Hash128, std::list<Hash128>::iterator, Hash128Hasher> where_;
};

class S3FifoPolicy final : public EvictionPolicy {
 public:
  explicit S3FifoPolicy(uint64_t capacity_bytes);
  void Insert(const Hash128& key, uint64_t bytes) override;
  void Touch(const Hash128& key) override;
  void Remove(const Hash128& key) override;
  std::optional<Hash128> PopVictim() override;
  size_t size() const override { return entries_.size(); }

 private:
  enum class Queue { kSmall, kMain };
  struct Entry {
    uint64_t bytes = 0;
    int freq = 0;
    Queue queue = Queue::kSmall;
    std::list<Hash128>::iterator pos;
  };
  std::list<Hash128>& QueueOf(Queue q) { return q == Queue::kSmall ? small_ : main_; }
  void Enqueue(const Hash128& key, Entry& entry, Queue q);
  void Dequeue(Entry& entry);
  void RememberGhost(const Hash128& key, uint64_t bytes);

  uint64_t small_target_;
  uint64_t ghost_target_;
  uint64_t small_bytes_ = 0;
  std::list<Hash128> small_, main_;  // front: newest; victims come from the back
  std::unordered_map<Hash128, Entry, Hash128Hasher> entries_;
  std::list<std::pair<Hash128, uint64_t>> ghost_;
  std::unordered_map<Hash128, std::list<std::pair<Hash128, uint64_t>>::iterator, Hash128Hasher> ghost_where_;
  uint64_t ghost_bytes_ = 0;
};

}  // namespace lazykv::cache
