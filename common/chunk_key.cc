#include "common/chunk_key.h"

#include <xxhash.h>

#include <array>
#include <bit>
#include <cstring>

#include "absl/strings/str_format.h"

namespace lazykv {
namespace {

static_assert(std::endian::native == std::endian::little,
              "chunk keys hash little-endian fields; add byte swapping for big-endian hosts");

XXH3_state_t* State(void* p) { return static_cast<XXH3_state_t*>(p); }

}  // namespace

std::string Hash128::ToHex() const { return absl::StrFormat("%016x%016x", high, low); }

absl::StatusOr<Hash128> Hash128::FromHex(std::string_view hex) {
  if (hex.size() != 32) {
    return absl::InvalidArgumentError(absl::StrFormat("hash must be 32 hex digits, got %d characters", hex.size()));
  }
  Hash128 out;
  for (size_t i = 0; i < 32; ++i) {
    const char c = hex[i];
    int digit;
    if (c >= '0' && c <= '9')
      digit = c - '0';
    else if (c >= 'a' && c <= 'f')
      digit = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F')
      digit = c - 'A' + 10;
    else
      return absl::InvalidArgumentError(absl::StrFormat("hash has a non-hex character at %d", i));
    uint64_t& word = i < 16 ? out.high : out.low;
    word = (word << 4) | static_cast<uint64_t>(digit);
  }
  return out;
}

Hasher128::Hasher128() : state_(XXH3_createState()) { XXH3_128bits_reset(State(state_)); }
Hasher128::~Hasher128() { XXH3_freeState(State(state_)); }

Hasher128& Hasher128::AddRaw(const void* data, size_t size) {
  XXH3_128bits_update(State(state_), data, size);
  return *this;
}

Hasher128& Hasher128::AddU64(uint64_t value) { return AddRaw(&value, sizeof(value)); }

Hasher128& Hasher128::AddBytes(std::span<const uint8_t> bytes) {
  AddU64(bytes.size());
  return AddRaw(bytes.data(), bytes.size());
}

Hasher128& Hasher128::AddString(std::string_view text) {
  AddU64(text.size());
  return AddRaw(text.data(), text.size());
}

Hasher128& Hasher128::AddTokens(std::span<const int32_t> tokens) {
  AddU64(tokens.size());
  return AddRaw(tokens.data(), tokens.size_bytes());
}

Hasher128& Hasher128::AddHash(const Hash128& hash) { return AddU64(hash.high).AddU64(hash.low); }

Hash128 Hasher128::Finish() const {
  const XXH128_hash_t h = XXH3_128bits_digest(State(state_));
  return Hash128{h.high64, h.low64};
}

ChunkKey MakeChunkKey(const Hash128& model_fingerprint, std::span<const int32_t> anchor_tokens,
                      std::span<const int32_t> chunk_tokens) {
  Hasher128 hasher;
  hasher.AddString("lazykv.chunk").AddU64(kChunkFormatVersion).AddHash(model_fingerprint);
  hasher.AddTokens(anchor_tokens).AddTokens(chunk_tokens);
  return hasher.Finish();
}

}  // namespace lazykv

namespace lazykv {

Hash128 MakeModelFingerprint(const Hash128& weights_hash, std::string_view kv_dtype) {
  Hasher128 hasher;
  hasher.AddString("lazykv.model").AddHash(weights_hash).AddString(kv_dtype);
  return hasher.Finish();
}

ChunkKey MakeAnchorKey(const Hash128& model_fingerprint, std::span<const int32_t> anchor_tokens) {
  Hasher128 hasher;
  hasher.AddString("lazykv.anchor").AddU64(kChunkFormatVersion).AddHash(model_fingerprint).AddTokens(anchor_tokens);
  return hasher.Finish();
}

Hash128 MakePrefixRootKey(const Hash128& model_fingerprint) {
  Hasher128 hasher;
  hasher.AddString("lazykv.prefix").AddU64(kChunkFormatVersion).AddHash(model_fingerprint);
  return hasher.Finish();
}

Hash128 MakePrefixBlockKey(const Hash128& parent, std::span<const int32_t> block_tokens) {
  Hasher128 hasher;
  hasher.AddHash(parent).AddTokens(block_tokens);
  return hasher.Finish();
}

}  // namespace lazykv
