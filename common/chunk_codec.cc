#include "common/chunk_codec.h"

#include <xxhash.h>

#include <cstring>

#include "absl/strings/str_format.h"

namespace lazykv {
namespace {

// Field offsets inside the 128-byte header.
constexpr size_t kOffMagic = 0;
constexpr size_t kOffVersion = 8;
constexpr size_t kOffHeaderBytes = 12;
constexpr size_t kOffKey = 16;
constexpr size_t kOffFingerprint = 32;
constexpr size_t kOffLayers = 48;
constexpr size_t kOffKvHeads = 52;
constexpr size_t kOffHeadDim = 56;
constexpr size_t kOffTokens = 60;
constexpr size_t kOffAnchor = 64;
constexpr size_t kOffDtype = 68;
constexpr size_t kOffPayloadBytes = 72;
constexpr size_t kOffPayloadChecksum = 80;
constexpr size_t kOffHeaderChecksum = 88;  // XXH3-64 of bytes [0, 88)
constexpr size_t kOffMac = 96;             // [96, 128): the MAC (chunk_mac.h), zero when unsigned
static_assert(kOffHeaderChecksum == kChunkMacCoveredHeaderBytes && kOffMac + kChunkMacBytes == kChunkHeaderBytes);

template <typename T>
void Put(std::string& out, size_t offset, T value) {
  std::memcpy(out.data() + offset, &value, sizeof(T));
}
template <typename T>
T Get(std::string_view in, size_t offset) {
  T value;
  std::memcpy(&value, in.data() + offset, sizeof(T));
  return value;
}
void PutHash(std::string& out, size_t offset, const Hash128& h) {
  Put(out, offset, h.high);
  Put(out, offset + 8, h.low);
}
Hash128 GetHash(std::string_view in, size_t offset) {
  return Hash128{Get<uint64_t>(in, offset), Get<uint64_t>(in, offset + 8)};
}

}  // namespace

absl::StatusOr<KvDtype> ParseKvDtype(std::string_view name) {
  if (name == "fp32") return KvDtype::kFp32;
  if (name == "bf16") return KvDtype::kBf16;
  if (name == "fp16") return KvDtype::kFp16;
  return absl::InvalidArgumentError(absl::StrFormat("unknown KV dtype '%s' (fp32, bf16, fp16)", std::string(name)));
}

size_t KvDtypeBytes(KvDtype dtype) { return dtype == KvDtype::kFp32 ? 4 : 2; }

uint64_t ChunkPayloadChecksum(std::string_view payload) { return XXH3_64bits(payload.data(), payload.size()); }

PayloadChecksummer::PayloadChecksummer() : state_(XXH3_createState()) {
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
}
PayloadChecksummer::~PayloadChecksummer() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }
void PayloadChecksummer::Update(std::string_view bytes) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), bytes.data(), bytes.size());
}
uint64_t PayloadChecksummer::Finish() const { return XXH3_64bits_digest(static_cast<XXH3_state_t*>(state_)); }

ChunkHeader MakeChunkHeader(const ChunkKey& key, const Hash128& model_fingerprint, const ChunkLayout& layout,
                            std::string_view payload) {
  return ChunkHeader{.layout_version = kChunkFormatVersion,
                     .key = key,
                     .model_fingerprint = model_fingerprint,
                     .layout = layout,
                     .payload_bytes = payload.size(),
                     .payload_checksum = ChunkPayloadChecksum(payload)};
}

std::string EncodeChunkHeader(const ChunkHeader& h) {
  std::string out(kChunkHeaderBytes, '\0');
  std::memcpy(out.data() + kOffMagic, kChunkMagic, sizeof(kChunkMagic));
  Put<uint32_t>(out, kOffVersion, h.layout_version);
  Put<uint32_t>(out, kOffHeaderBytes, kChunkHeaderBytes);
  PutHash(out, kOffKey, h.key);
  PutHash(out, kOffFingerprint, h.model_fingerprint);
  Put<uint32_t>(out, kOffLayers, h.layout.num_layers);
  Put<uint32_t>(out, kOffKvHeads, h.layout.n_kv_heads);
  Put<uint32_t>(out, kOffHeadDim, h.layout.head_dim);
  Put<uint32_t>(out, kOffTokens, h.layout.num_tokens);
  Put<uint32_t>(out, kOffAnchor, h.layout.anchor_tokens);
  Put<uint32_t>(out, kOffDtype, static_cast<uint32_t>(h.layout.dtype));
  Put<uint64_t>(out, kOffPayloadBytes, h.payload_bytes);
  Put<uint64_t>(out, kOffPayloadChecksum, h.payload_checksum);
  Put<uint64_t>(out, kOffHeaderChecksum, XXH3_64bits(out.data(), kOffHeaderChecksum));
  std::memcpy(out.data() + kOffMac, h.mac.data(), kChunkMacBytes);
  return out;
}

absl::StatusOr<ChunkHeader> DecodeChunkHeader(std::string_view bytes) {
  if (bytes.size() < kChunkHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("chunk header needs %d bytes, got %d", kChunkHeaderBytes, bytes.size()));
  }
  if (std::memcmp(bytes.data() + kOffMagic, kChunkMagic, sizeof(kChunkMagic)) != 0) {
    return absl::InvalidArgumentError("chunk header: bad magic (not an LKVCHUNK chunk)");
  }
  ChunkHeader h;
  h.layout_version = Get<uint32_t>(bytes, kOffVersion);
  if (h.layout_version != kChunkFormatVersion) {
    return absl::InvalidArgumentError(
        absl::StrFormat("chunk header: layout_version %d is not supported (this build reads version %d)",
                        h.layout_version, kChunkFormatVersion));
  }
  if (Get<uint32_t>(bytes, kOffHeaderBytes) != kChunkHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrFormat("chunk header: header_bytes %d, expected %d",
                                                      Get<uint32_t>(bytes, kOffHeaderBytes), kChunkHeaderBytes));
  }
  if (Get<uint64_t>(bytes, kOffHeaderChecksum) != XXH3_64bits(bytes.data(), kOffHeaderChecksum)) {
    return absl::DataLossError("chunk header: header checksum mismatch");
  }
  h.key = GetHash(bytes, kOffKey);
  h.model_fingerprint = GetHash(bytes, kOffFingerprint);
  h.layout.num_layers = Get<uint32_t>(bytes, kOffLayers);
  h.layout.n_kv_heads = Get<uint32_t>(bytes, kOffKvHeads);
  h.layout.head_dim = Get<uint32_t>(bytes, kOffHeadDim);
  h.layout.num_tokens = Get<uint32_t>(bytes, kOffTokens);
  h.layout.anchor_tokens = Get<uint32_t>(bytes, kOffAnchor);
  const uint32_t dtype = Get<uint32_t>(bytes, kOffDtype);
  if (dtype < 1 || dtype > 3)
    return absl::InvalidArgumentError(absl::StrFormat("chunk header: unknown dtype %d", dtype));
  h.layout.dtype = static_cast<KvDtype>(dtype);
  h.payload_bytes = Get<uint64_t>(bytes, kOffPayloadBytes);
  h.payload_checksum = Get<uint64_t>(bytes, kOffPayloadChecksum);
  std::memcpy(h.mac.data(), bytes.data() + kOffMac, kChunkMacBytes);
  // ChunkLayout::payload_bytes() wraps modulo 2^64: a layout of huge dimensions could
  // agree with a small payload_bytes. Its exact size must fit, with the header, in 64 bits.
  uint64_t exact = KvDtypeBytes(h.layout.dtype);
  bool too_large = false;
  for (uint64_t factor : {uint64_t{h.layout.n_kv_heads}, uint64_t{h.layout.head_dim}, uint64_t{h.layout.num_tokens},
                          uint64_t{2}, uint64_t{h.layout.num_layers}}) {
    too_large = too_large || __builtin_mul_overflow(exact, factor, &exact);
  }
  if (too_large || exact > UINT64_MAX - kChunkHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "chunk header: the layout (%d layers x 2 x %d tokens x %d KV heads x %d head_dim) is too large for 64-bit sizes",
        h.layout.num_layers, h.layout.num_tokens, h.layout.n_kv_heads, h.layout.head_dim));
  }
  if (h.payload_bytes != h.layout.payload_bytes()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "chunk header: payload_bytes %d disagrees with the layout (%d layers x 2 x %d tokens x %d bytes per row = %d)",
        h.payload_bytes, h.layout.num_layers, h.layout.num_tokens, h.layout.row_bytes(), h.layout.payload_bytes()));
  }
  return h;
}

std::string EncodeChunk(const ChunkHeader& header, std::string_view payload) {
  std::string out = EncodeChunkHeader(header);
  out.append(payload);
  return out;
}

absl::Status VerifyChunkPayload(const ChunkHeader& header, std::span<const std::string_view> pieces) {
  uint64_t size = 0;
  for (std::string_view piece : pieces) size += piece.size();
  if (size != header.payload_bytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("chunk payload has %d bytes; header.payload_bytes says %d", size, header.payload_bytes));
  }
  PayloadChecksummer checksum;
  for (std::string_view piece : pieces) checksum.Update(piece);
  if (checksum.Finish() != header.payload_checksum) {
    return absl::DataLossError(
        absl::StrFormat("chunk %s: payload checksum mismatch (corrupt bytes)", header.key.ToHex()));
  }
  return absl::OkStatus();
}

absl::StatusOr<ChunkView> DecodeChunk(std::string_view stored) {
  auto header = DecodeChunkHeader(stored);
  if (!header.ok()) return header.status();
  const std::string_view payload = stored.substr(std::min(stored.size(), kChunkHeaderBytes));
  if (absl::Status s = VerifyChunkPayload(*header, {&payload, 1}); !s.ok()) return s;
  return ChunkView{*header, payload};
}

}  // namespace lazykv
