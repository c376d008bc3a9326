#include "worker/engine/shared_chunk_reservations.h"

#include <unordered_set>

namespace lazykv {

int SharedChunkReservations::ExtraBlocks(std::span<const Chunk> chunks) const {
  std::unordered_set<ChunkKey, Hash128Hasher> counted;  // a request may name a document twice
  int extra = 0;
  for (const Chunk& chunk : chunks) {
    if (!entries_.contains(chunk.key) && counted.insert(chunk.key).second) extra += chunk.blocks;
  }
  return extra;
}

void SharedChunkReservations::Add(std::span<const Chunk> chunks) {
  for (const Chunk& chunk : chunks) {
    Entry& entry = entries_[chunk.key];
    if (entry.users++ == 0) {
      entry.blocks = chunk.blocks;
      reserved_blocks_ += chunk.blocks;
    }
  }
}

void SharedChunkReservations::Remove(std::span<const Chunk> chunks) {
  for (const Chunk& chunk : chunks) {
    auto it = entries_.find(chunk.key);
    if (it == entries_.end()) continue;
    if (--it->second.users == 0) {
      reserved_blocks_ -= it->second.blocks;
      entries_.erase(it);
    }
  }
}

}  // namespace lazykv
