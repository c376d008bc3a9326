// Random chunk payloads for the cache benchmarks: a bf16 layout (8 KV heads of 128, one layer)
// whose payload is about the size asked, filled with random finite values (a worker refuses
// a chunk holding an infinity or a NaN).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "common/chunk_codec.h"
#include "common/splitmix64.h"

namespace lazykv::bench {

// The layout of a payload of about `payload_bytes` (whole tokens, not more).
inline ChunkLayout BenchLayout(size_t payload_bytes) {
  ChunkLayout layout{
      .num_layers = 1, .n_kv_heads = 8, .head_dim = 128, .num_tokens = 0, .anchor_tokens = 1, .dtype = KvDtype::kBf16};
  layout.num_tokens = static_cast<uint32_t>(payload_bytes / (2 * layout.row_bytes()));
  return layout;
}

// layout.payload_bytes() random bytes drawn from `rng`, with the top exponent bit of every
// bf16 value cleared (so none is an infinity or a NaN).
inline std::string RandomPayload(const ChunkLayout& layout, uint64_t& rng) {
  std::string payload(layout.payload_bytes(), '\0');
  for (size_t i = 0; i + 8 <= payload.size(); i += 8) {
    const uint64_t word = SplitMix64(rng) & ~0x4000400040004000ull;
    std::memcpy(payload.data() + i, &word, 8);
  }
  return payload;
}

// A stored chunk (header + payload) of about `payload_bytes` of random bf16 KV under a random
// key, for the fingerprint {1, 2}.
inline std::string RandomStoredChunk(size_t payload_bytes, uint64_t& rng) {
  const ChunkLayout layout = BenchLayout(payload_bytes);
  const std::string payload = RandomPayload(layout, rng);
  return EncodeChunk(MakeChunkHeader(Hash128{SplitMix64(rng), SplitMix64(rng)}, Hash128{1, 2}, layout, payload),
                     payload);
}

}  // namespace lazykv::bench
