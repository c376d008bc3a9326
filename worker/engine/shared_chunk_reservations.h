// Admission's account of the pool blocks that running requests' shared chunks may occupy
// (lazy and block modes: the anchor and each document, encoded once and referenced by every
// request that uses it). A chunk's blocks count once however many running requests use it,
// so requests that share documents are not charged as if each held a private copy. Chunks
// no running request uses are cached and evictable, so they need no reservation.
// Not thread-safe: the engine's scheduling thread owns it.
#pragma once

#include <span>
#include <unordered_map>

#include "common/chunk_key.h"

namespace lazykv {

class SharedChunkReservations {
 public:
  struct Chunk {
    ChunkKey key;
    int blocks = 0;
  };

  // The blocks that Add(chunks) would reserve beyond those reserved now.
  int ExtraBlocks(std::span<const Chunk> chunks) const;
  void Add(std::span<const Chunk> chunks);
  // Undoes one Add of the same chunks.
  // REQUIRES: Add(chunks) was called and not yet undone (a chunk never added is ignored).
  void Remove(std::span<const Chunk> chunks);

  int reserved_blocks() const { return reserved_blocks_; }

 private:
  struct Entry {
    int users = 0;
    int blocks = 0;
  };
  std::unordered_map<ChunkKey, Entry, Hash128Hasher> entries_;
  int reserved_blocks_ = 0;
};

}  // namespace lazykv
