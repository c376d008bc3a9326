// The chunk codec (DESIGN.md sections 3 and 5): how one chunk's position-free KV travels
// and rests. A stored chunk is a fixed 128-byte header followed by the payload.
//
// Header (little-endian): magic "LKVCHUNK", layout version, header size, chunk key,
// model fingerprint, layout (layers, KV heads, head dim, tokens, anchor tokens, dtype),
// payload size, XXH3-64 of the payload, XXH3-64 of the header bytes before it, and in the
// last 32 bytes a MAC under the fleet's secret (all zero when unsigned; chunk_mac.h).
//
// Payload: for each layer, all K rows then all V rows, token-major:
//   [layer][K|V][token][n_kv_heads * head_dim]
// so a receiver scatters a layer's K (or V) into paged blocks with one contiguous copy
// per block. The keys are rotated at their chunk-local positions anchor_tokens + i.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/chunk_key.h"

namespace lazykv {

inline constexpr size_t kChunkHeaderBytes = 128;
inline constexpr size_t kChunkMacBytes = 32;               // the header's last 32 bytes (chunk_mac.h)
inline constexpr size_t kChunkMacCoveredHeaderBytes = 88;  // the header fields a MAC covers
inline constexpr char kChunkMagic[8] = {'L', 'K', 'V', 'C', 'H', 'U', 'N', 'K'};

enum class KvDtype : uint32_t { kFp32 = 1, kBf16 = 2, kFp16 = 3 };

absl::StatusOr<KvDtype> ParseKvDtype(std::string_view name);  // "fp32", "bf16", "fp16"
size_t KvDtypeBytes(KvDtype dtype);

struct ChunkLayout {
  uint32_t num_layers = 0;
  uint32_t n_kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t num_tokens = 0;
  uint32_t anchor_tokens = 0;  // the keys of token i are rotated at position anchor_tokens + i
  KvDtype dtype = KvDtype::kFp32;

  friend bool operator==(const ChunkLayout&, const ChunkLayout&) = default;

  size_t row_bytes() const { return static_cast<size_t>(n_kv_heads) * head_dim * KvDtypeBytes(dtype); }
  // Bytes of one layer's K (or V) rows.
  size_t plane_bytes() const { return row_bytes() * num_tokens; }
  size_t payload_bytes() const { return plane_bytes() * 2 * num_layers; }
  // Offset of the K (kind 0) or V (kind 1) plane of `layer`.
  size_t plane_offset(uint32_t layer, int kind) const {
    return plane_bytes() * (2 * static_cast<size_t>(layer) + kind);
  }
};

struct ChunkHeader {
  uint32_t layout_version = kChunkFormatVersion;
  ChunkKey key;
  Hash128 model_fingerprint;
  ChunkLayout layout;
  uint64_t payload_bytes = 0;
  uint64_t payload_checksum = 0;
  std::array<uint8_t, kChunkMacBytes> mac{};  // HMAC-SHA256 (chunk_mac.h); all zero: unsigned
};

uint64_t ChunkPayloadChecksum(std::string_view payload);

// Streaming twin of ChunkPayloadChecksum, for payloads that arrive in slices.
// Not thread-safe: one stream feeds it.
class PayloadChecksummer {
 public:
  PayloadChecksummer();
  ~PayloadChecksummer();
  PayloadChecksummer(const PayloadChecksummer&) = delete;
  PayloadChecksummer& operator=(const PayloadChecksummer&) = delete;
  void Update(std::string_view bytes);
  uint64_t Finish() const;

 private:
  void* state_;  // XXH3_state_t
};

// Builds a header for `payload` (sizes and checksum filled in).
ChunkHeader MakeChunkHeader(const ChunkKey& key, const Hash128& model_fingerprint, const ChunkLayout& layout,
                            std::string_view payload);

std::string EncodeChunkHeader(const ChunkHeader& header);

// Parses and checks a header: magic, version, header checksum, and that payload_bytes
// agrees with the layout. `bytes` may extend past the header.
absl::StatusOr<ChunkHeader> DecodeChunkHeader(std::string_view bytes);

// The stored form: header then payload.
std::string EncodeChunk(const ChunkHeader& header, std::string_view payload);

// Checks a payload given as contiguous pieces against its header: exact length
// (INVALID_ARGUMENT) and checksum (DATA_LOSS).
absl::Status VerifyChunkPayload(const ChunkHeader& header, std::span<const std::string_view> pieces);

// A decoded chunk whose payload points into the caller's bytes.
struct ChunkView {
  ChunkHeader header;
  std::string_view payload;
};

// Full check of a stored chunk: header, exact length, payload checksum (DATA_LOSS when
// the bytes do not match their checksum, INVALID_ARGUMENT for a malformed chunk).
absl::StatusOr<ChunkView> DecodeChunk(std::string_view stored);

}  // namespace lazykv
