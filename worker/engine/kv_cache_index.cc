#include "worker/engine/kv_cache_index.h"

namespace lazykv {

KvCacheIndex::~KvCacheIndex() {
  for (const CachedKv& entry : lru_) Release(entry);
}

const CachedKv* KvCacheIndex::Lookup(const Hash128& key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second);
  return &*it->second;
}

void KvCacheIndex::Insert(const Hash128& key, std::vector<KvBlockRef> blocks) {
  if (entries_.contains(key)) return;
  CachedKv entry{key, std::move(blocks), 0};
  for (const KvBlockRef& ref : entry.blocks) {
    allocator_->Ref(ref.block);
    entry.num_tokens += ref.num_tokens;
  }
  num_blocks_ += entry.blocks.size();
  lru_.push_front(std::move(entry));
  entries_.emplace(key, lru_.begin());
}

bool KvCacheIndex::Evictable(const CachedKv& entry) const {
  for (const KvBlockRef& ref : entry.blocks) {
    if (allocator_->refcount(ref.block) > 1) return false;  // a running sequence holds it
  }
  return true;
}

void KvCacheIndex::Release(const CachedKv& entry) {
  for (const KvBlockRef& ref : entry.blocks) allocator_->Unref(ref.block);
  num_blocks_ -= entry.blocks.size();
}

void KvCacheIndex::CountReferences(std::vector<int>& per_block) const {
  for (const CachedKv& entry : lru_) {
    for (const KvBlockRef& ref : entry.blocks) ++per_block[ref.block];
  }
}

bool KvCacheIndex::EvictUntilFree(int needed) {
  for (auto it = lru_.end(); allocator_->num_free() < needed && it != lru_.begin();) {
    --it;
    if (!Evictable(*it)) continue;
    Release(*it);
    entries_.erase(it->key);
    it = lru_.erase(it);
    ++evictions_;
  }
  return allocator_->num_free() >= needed;
}

}  // namespace lazykv
