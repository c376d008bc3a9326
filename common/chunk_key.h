// Identity of position-free chunk KV (DESIGN.md section 3):
// ChunkKey = XXH3-128(format version, model fingerprint, anchor token ids, chunk token ids).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "absl/status/statusor.h"

namespace lazykv {

// A 128-bit content hash. Stable across processes and machines (no random seeds).
struct Hash128 {
  uint64_t high = 0;
  uint64_t low = 0;

  friend bool operator==(const Hash128&, const Hash128&) = default;
  std::string ToHex() const;
  static absl::StatusOr<Hash128> FromHex(std::string_view hex);
};

// Bumped whenever the meaning of chunk KV bytes changes (layout, encoding rules).
inline constexpr uint32_t kChunkFormatVersion = 1;

// Incremental XXH3-128 over little-endian fields; each variable-length field is
// length-prefixed so that no two different field sequences hash the same bytes.
// Not thread-safe: one hasher per hash being computed.
class Hasher128 {
 public:
  Hasher128();
  ~Hasher128();
  Hasher128(const Hasher128&) = delete;
  Hasher128& operator=(const Hasher128&) = delete;

  Hasher128& AddU64(uint64_t value);
  Hasher128& AddBytes(std::span<const uint8_t> bytes);    // length-prefixed
  Hasher128& AddString(std::string_view text);            // length-prefixed
  Hasher128& AddTokens(std::span<const int32_t> tokens);  // length-prefixed
  Hasher128& AddHash(const Hash128& hash);
  // Raw bytes with no length prefix, for streaming a large blob in pieces.
  Hasher128& AddRaw(const void* data, size_t size);
  Hash128 Finish() const;

 private:
  void* state_;  // XXH3_state_t, kept opaque so xxhash.h stays out of headers
};

using ChunkKey = Hash128;

ChunkKey MakeChunkKey(const Hash128& model_fingerprint, std::span<const int32_t> anchor_tokens,
                      std::span<const int32_t> chunk_tokens);

struct Hash128Hasher {
  size_t operator()(const Hash128& h) const { return static_cast<size_t>(h.low ^ (h.high * 0x9e3779b97f4a7c15ULL)); }
};

}  // namespace lazykv

namespace lazykv {

// Fingerprint of a model as a KV producer: its weights (which hash its architecture and
// RoPE parameters too) and the element type its KV is stored in.
Hash128 MakeModelFingerprint(const Hash128& weights_hash, std::string_view kv_dtype);

// Key of the anchor's own KV (positions 0..|A|-1), shared by every request.
ChunkKey MakeAnchorKey(const Hash128& model_fingerprint, std::span<const int32_t> anchor_tokens);

// Prefix caching (the `prefix` mode): a full block's key chains its parent's key, so a
// block is found only after the same tokens at the same positions.
Hash128 MakePrefixRootKey(const Hash128& model_fingerprint);
Hash128 MakePrefixBlockKey(const Hash128& parent, std::span<const int32_t> block_tokens);

}  // namespace lazykv
