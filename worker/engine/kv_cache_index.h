// The local pool's index of reusable KV: chunks (position-free documents), the anchor,
// and prefix-cache blocks, each keyed by a 128-bit content hash. The index holds one
// reference on each block of an entry; entries whose blocks nobody else holds are
// evicted least-recently-used when the pool needs room. Not thread-safe: one engine's
// scheduling thread owns it. REQUIRES: the allocator outlives the index.
#pragma once

#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

#include "common/chunk_key.h"
#include "kernels/kv_block_ref.h"
#include "worker/engine/kv_block_allocator.h"

namespace lazykv {

struct CachedKv {
  Hash128 key;
  std::vector<KvBlockRef> blocks;  // delta 0: as stored
  int32_t num_tokens = 0;
};

class KvCacheIndex {
 public:
  explicit KvCacheIndex(KvBlockAllocator* allocator) : allocator_(allocator) {}
  ~KvCacheIndex();
  KvCacheIndex(const KvCacheIndex&) = delete;
  KvCacheIndex& operator=(const KvCacheIndex&) = delete;

  // The entry, marked most recently used; nullptr on a miss.
  // REQUIRES (of the caller): use the pointer only until the next Insert or
  // EvictUntilFree; copy the block list and take references on its blocks to keep them.
  const CachedKv* Lookup(const Hash128& key);
  bool Contains(const Hash128& key) const { return entries_.contains(key); }
  // Adds an entry as the most recently used; the index takes one reference on each block
  // (the caller keeps its own). A key already present is left as it is.
  // REQUIRES: every block is allocated.
  void Insert(const Hash128& key, std::vector<KvBlockRef> blocks);
  // Evicts idle entries (no block referenced by anyone else), least recently used first,
  // until `needed` blocks are free. False if it cannot; what it evicted stays evicted.
  bool EvictUntilFree(int needed);

  size_t size() const { return entries_.size(); }
  uint64_t evictions() const { return evictions_; }
  size_t num_blocks() const { return num_blocks_; }
  // Adds the index's own references to per_block[block] (one per entry holding it).
  // REQUIRES: per_block.size() is the pool's block count.
  void CountReferences(std::vector<int>& per_block) const;

 private:
  bool Evictable(const CachedKv& entry) const;
  void Release(const CachedKv& entry);

  KvBlockAllocator* allocator_;
  std::list<CachedKv> lru_;  // front: most recently used
  std::unordered_map<Hash128, std::list<CachedKv>::iterator, Hash128Hasher> entries_;
  uint64_t evictions_ = 0;
  size_t num_blocks_ = 0;  // blocks referenced by entries
};

}  // namespace lazykv
