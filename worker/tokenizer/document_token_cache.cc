#include "worker/tokenizer/document_token_cache.h"

#include <xxhash.h>

namespace lazykv {
namespace {

absl::uint128 TextKey(std::string_view text) {
  const XXH128_hash_t h = XXH3_128bits(text.data(), text.size());
  return absl::MakeUint128(h.high64, h.low64);
}

// A list node, a hash slot and the vectors' own headers, roughly.
constexpr size_t kEntryOverhead = 128;

}  // namespace

DocumentTokenCache::DocumentTokenCache(const Tokenizer* tokenizer, size_t max_bytes, Observer observer, KeyFunction key)
    : tokenizer_(tokenizer), max_bytes_(max_bytes), observer_(std::move(observer)), key_(key ? key : TextKey) {}

size_t DocumentTokenCache::EntryBytes(size_t text_bytes, size_t tokens) {
  return text_bytes + tokens * sizeof(int32_t) + kEntryOverhead;
}

std::vector<int32_t> DocumentTokenCache::Encode(std::string_view text) {
  const absl::uint128 key = key_(text);
  {
    MutexLock lock(&mu_);
    if (auto it = index_.find(key); it != index_.end() && it->second->text == text) {
      lru_.splice(lru_.begin(), lru_, it->second);
      ++stats_.hits;
      std::vector<int32_t> tokens = it->second->tokens;
      lock.Unlock();
      if (observer_) observer_(true);
      return tokens;
    }
    ++stats_.misses;
  }
  if (observer_) observer_(false);
  std::vector<int32_t> tokens = tokenizer_->Encode(text);
  const size_t bytes = EntryBytes(text.size(), tokens.size());
  if (bytes > max_bytes_ / 8) return tokens;  // one text must not flush the rest
  MutexLock lock(&mu_);
  if (auto it = index_.find(key); it != index_.end()) EraseLocked(it->second);  // raced in, or a collision
  lru_.push_front(Entry{key, std::string(text), tokens});
  index_.emplace(key, lru_.begin());
  stats_.bytes += bytes;
  while (stats_.bytes > max_bytes_) {
    EraseLocked(std::prev(lru_.end()));
    ++stats_.evictions;
  }
  return tokens;
}

void DocumentTokenCache::EraseLocked(Lru::iterator it) {
  stats_.bytes -= EntryBytes(it->text.size(), it->tokens.size());
  index_.erase(it->key);
  lru_.erase(it);
}

DocumentTokenCache::Stats DocumentTokenCache::stats() const {
  MutexLock lock(&mu_);
  Stats stats = stats_;
  stats.entries = lru_.size();
  return stats;
}

}  // namespace lazykv
