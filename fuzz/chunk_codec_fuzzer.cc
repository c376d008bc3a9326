// chunk_codec_fuzzer: the chunk codec (common/chunk_codec.h), the chunk MAC
// (common/chunk_mac.h) and the value check (common/chunk_values.h).
//
// Each input is used twice:
// - raw: the bytes go unmodified to DecodeChunkHeader and DecodeChunk, and to
//   CheckPayloadFinite (whole and split into pieces);
// - structured: the input picks a small layout, key, fingerprint, payload and whether to
//   sign it (with a fixed test key), then one mutation (a header field set through
//   EncodeChunkHeader, so that the header checksum stays valid; a raw header byte with the
//   checksum recomputed; a truncation, an extension, a flipped byte; a layout whose size
//   wraps 64 bits). The checksums and the MAC are made by the project's own encoders, so
//   mutations get past them into the decoding and checking code.
// Invariants (abort on violation):
// - a valid encoded chunk decodes to what was encoded; a header that decodes re-encodes to
//   the same 128 bytes, and DecodeChunkHeader agrees with DecodeChunk;
// - a decoded chunk's payload is the rest of the bytes, header.payload_bytes long, the
//   exact (not wrapped) size its layout implies, and VerifyChunkPayload accepts it in pieces;
// - Verify accepts what Sign produced, refuses any flipped byte it covers or of the tag,
//   refuses an unsigned chunk, and accepts a mutated chunk only if the bytes it covers are
//   the ones signed;
// - CheckPayloadFinite answers the same whole and in pieces, and agrees with a plain
//   element-by-element reference (which element, at which byte).
#include <fuzzer/FuzzedDataProvider.h>
#include <xxhash.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/chunk_codec.h"
#include "common/chunk_mac.h"
#include "common/chunk_values.h"
#include "fuzz/fuzz_util.h"

namespace {

using namespace lazykv;

constexpr size_t kHeaderChecksumOffset = 88;  // XXH3-64 of header bytes [0, 88) (chunk_codec.cc)
constexpr size_t kMacOffset = kChunkHeaderBytes - kChunkMacBytes;

const ChunkMac& TestMac() {
  static const ChunkMac mac{std::string(fuzz::kTestMacKey)};
  return mac;
}

std::span<const std::string_view> One(const std::string_view& bytes) { return {&bytes, 1}; }

// The payload size a layout implies, computed without wrapping; nullopt past 64 bits.
std::optional<uint64_t> ExactPayloadBytes(const ChunkLayout& l) {
  uint64_t v = KvDtypeBytes(l.dtype);
  for (uint64_t factor :
       {uint64_t{l.n_kv_heads}, uint64_t{l.head_dim}, uint64_t{l.num_tokens}, uint64_t{2}, uint64_t{l.num_layers}}) {
    if (__builtin_mul_overflow(v, factor, &v)) return std::nullopt;
  }
  return v;
}

// Reference for CheckPayloadFinite: the byte offset of the first whole element of
// `bytes` whose exponent bits are all ones (an infinity or a NaN).
std::optional<size_t> FirstNonFinite(KvDtype dtype, std::string_view bytes) {
  const size_t width = KvDtypeBytes(dtype);
  for (size_t at = 0; at + width <= bytes.size(); at += width) {
    uint32_t v = 0;
    std::memcpy(&v, bytes.data() + at, width);  // little-endian
    const uint32_t mask = dtype == KvDtype::kFp32 ? 0x7F800000u : dtype == KvDtype::kBf16 ? 0x7F80u : 0x7C00u;
    if ((v & mask) == mask) return at;
  }
  return std::nullopt;
}

// `bytes` cut at up to 8 points the input picks (empty pieces included).
std::vector<std::string_view> Split(std::string_view bytes, FuzzedDataProvider& in) {
  std::vector<std::string_view> pieces;
  const int cuts = in.ConsumeIntegralInRange<int>(0, 8);
  size_t at = 0;
  for (int i = 0; i < cuts && at <= bytes.size(); ++i) {
    const size_t n = in.ConsumeIntegralInRange<size_t>(0, bytes.size() - at);
    pieces.push_back(bytes.substr(at, n));
    at += n;
  }
  pieces.push_back(bytes.substr(at));
  return pieces;
}

void CheckValues(KvDtype dtype, std::string_view payload, const std::vector<std::string_view>& pieces) {
  const absl::Status whole = CheckPayloadFinite(dtype, One(payload));
  const absl::Status split = CheckPayloadFinite(dtype, pieces);
  FUZZ_CHECK(whole == split);
  const std::optional<size_t> bad = FirstNonFinite(dtype, payload);
  FUZZ_CHECK(whole.ok() == !bad.has_value());
  if (bad) {
    FUZZ_CHECK(whole.code() == absl::StatusCode::kDataLoss);
    FUZZ_CHECK(whole.message() == absl::StrFormat("chunk payload holds a non-finite value at byte %d", *bad));
  }
}

// Whatever DecodeChunk accepted.
void CheckDecoded(std::string_view stored, const ChunkView& view, FuzzedDataProvider& in) {
  const std::string_view header_bytes = stored.substr(0, kChunkHeaderBytes);
  FUZZ_CHECK(EncodeChunkHeader(view.header) == header_bytes);
  const absl::StatusOr<ChunkHeader> header = DecodeChunkHeader(stored);
  FUZZ_CHECK(header.ok());
  FUZZ_CHECK(EncodeChunkHeader(*header) == header_bytes);
  FUZZ_CHECK(view.payload.data() == stored.data() + kChunkHeaderBytes);
  FUZZ_CHECK(view.payload.size() == stored.size() - kChunkHeaderBytes);
  FUZZ_CHECK(view.payload.size() == view.header.payload_bytes);
  const std::optional<uint64_t> exact = ExactPayloadBytes(view.header.layout);
  if (!exact || *exact != view.header.payload_bytes) {
    std::fprintf(stderr,
                 "decoded layout (%u layers, %u kv heads, head_dim %u, %u tokens, dtype %u) implies %s bytes, "
                 "header.payload_bytes is %llu\n",
                 view.header.layout.num_layers, view.header.layout.n_kv_heads, view.header.layout.head_dim,
                 view.header.layout.num_tokens, static_cast<unsigned>(view.header.layout.dtype),
                 exact ? std::to_string(*exact).c_str() : "more than 2^64",
                 static_cast<unsigned long long>(view.header.payload_bytes));
  }
  FUZZ_CHECK(exact.has_value() && *exact == view.header.payload_bytes);
  // Every plane lies inside the payload.
  const ChunkLayout& l = view.header.layout;
  if (l.num_layers > 0) {
    FUZZ_CHECK(l.plane_offset(l.num_layers - 1, 1) + l.plane_bytes() == view.header.payload_bytes);
  }
  const std::vector<std::string_view> pieces = Split(view.payload, in);
  FUZZ_CHECK(VerifyChunkPayload(view.header, pieces).ok());
  PayloadChecksummer streaming;
  for (std::string_view piece : pieces) streaming.Update(piece);
  FUZZ_CHECK(streaming.Finish() == ChunkPayloadChecksum(view.payload));
  CheckValues(view.header.layout.dtype, view.payload, pieces);
}

// The input as it is.
void Raw(std::string_view bytes, FuzzedDataProvider& in) {
  (void)DecodeChunkHeader(bytes);
  const absl::StatusOr<ChunkView> view = DecodeChunk(bytes);
  if (view.ok()) {
    CheckDecoded(bytes, *view, in);
    // A chunk nobody signed with the test key does not verify (forging HMAC-SHA256 is
    // out of a fuzzer's reach).
    const bool tagged = view->header.mac == TestMac().Sign(view->header, One(view->payload));
    FUZZ_CHECK(TestMac().Verify(view->header, One(view->payload)).ok() == tagged);
  } else {
    FUZZ_CHECK(!view.status().message().empty());
  }
  for (KvDtype dtype : {KvDtype::kFp32, KvDtype::kBf16, KvDtype::kFp16}) CheckValues(dtype, bytes, Split(bytes, in));
}

uint32_t SomeU32(FuzzedDataProvider& in) {
  return in.ConsumeBool() ? (1u << in.ConsumeIntegralInRange<int>(0, 31)) : in.ConsumeIntegral<uint32_t>();
}

void Structured(FuzzedDataProvider& in) {
  ChunkLayout layout;
  layout.num_layers = in.ConsumeIntegralInRange<uint32_t>(0, 3);
  layout.n_kv_heads = in.ConsumeIntegralInRange<uint32_t>(0, 3);
  layout.head_dim = in.ConsumeIntegralInRange<uint32_t>(0, 8);
  layout.num_tokens = in.ConsumeIntegralInRange<uint32_t>(0, 8);
  layout.anchor_tokens = in.ConsumeIntegral<uint32_t>();
  layout.dtype = static_cast<KvDtype>(in.ConsumeIntegralInRange<uint32_t>(1, 3));
  const ChunkKey key{in.ConsumeIntegral<uint64_t>(), in.ConsumeIntegral<uint64_t>()};
  const Hash128 fingerprint{in.ConsumeIntegral<uint64_t>(), in.ConsumeIntegral<uint64_t>()};
  const bool sign = in.ConsumeBool();
  const int mutation = in.ConsumeIntegralInRange<int>(0, 6);
  const uint64_t value = in.ConsumeIntegral<uint64_t>();
  const uint32_t where = in.ConsumeIntegral<uint32_t>();
  const bool resign = in.ConsumeBool();

  // The payload: the input's next bytes, repeated to the layout's size.
  const std::string source = in.ConsumeBytesAsString(in.ConsumeIntegralInRange<size_t>(0, 256));
  std::string payload(layout.payload_bytes(), '\0');
  for (size_t i = 0; !source.empty() && i < payload.size(); ++i) payload[i] = source[i % source.size()];

  ChunkHeader header = MakeChunkHeader(key, fingerprint, layout, payload);
  if (sign) header.mac = TestMac().Sign(header, One(payload));
  const std::string stored = EncodeChunk(header, payload);

  // The valid chunk decodes to what was encoded.
  {
    const absl::StatusOr<ChunkView> view = DecodeChunk(stored);
    FUZZ_CHECK(view.ok());
    FUZZ_CHECK(view->header.key == key && view->header.model_fingerprint == fingerprint);
    FUZZ_CHECK(view->header.layout == layout && view->header.mac == header.mac);
    FUZZ_CHECK(view->header.payload_bytes == payload.size());
    FUZZ_CHECK(view->payload == payload);
    CheckDecoded(stored, *view, in);
    FUZZ_CHECK(TestMac().Verify(view->header, One(view->payload)).ok() == sign);
  }
  if (sign) {  // a flipped bit anywhere the MAC covers, or in the tag, is refused
    const int bit = static_cast<int>(value % 64);
    if (!payload.empty()) {
      std::string flipped = payload;
      flipped[where % flipped.size()] ^= static_cast<char>(1 << (bit % 8));
      FUZZ_CHECK(!TestMac().Verify(header, One(flipped)).ok());
    }
    ChunkHeader h = header;
    switch (where % 10) {
      case 0:
        h.key.high ^= uint64_t{1} << bit;
        break;
      case 1:
        h.model_fingerprint.low ^= uint64_t{1} << bit;
        break;
      case 2:
        h.layout.num_layers ^= 1u << (bit % 32);
        break;
      case 3:
        h.layout.n_kv_heads ^= 1u << (bit % 32);
        break;
      case 4:
        h.layout.head_dim ^= 1u << (bit % 32);
        break;
      case 5:
        h.layout.num_tokens ^= 1u << (bit % 32);
        break;
      case 6:
        h.layout.anchor_tokens ^= 1u << (bit % 32);
        break;
      case 7:
        h.payload_bytes ^= uint64_t{1} << bit;
        break;
      case 8:
        h.payload_checksum ^= uint64_t{1} << bit;
        break;
      default:
        h.mac[(where / 10) % kChunkMacBytes] ^= static_cast<uint8_t>(1 << (bit % 8));
        break;
    }
    FUZZ_CHECK(!TestMac().Verify(h, One(payload)).ok());
  }

  // One mutation, then whatever decodes must keep the invariants.
  std::string mutated;
  std::string signed_bytes = sign ? stored.substr(0, kChunkMacCoveredHeaderBytes) + payload : "";
  std::array<uint8_t, kChunkMacBytes> signed_tag = header.mac;
  bool signed_now = sign;  // whether the mutated chunk carries a tag made by the test key
  // Signs `m` over `p` with the test key and remembers what was signed.
  auto sign_with_test_key = [&](ChunkHeader& m, const std::string& p) {
    signed_now = true;
    m.mac = TestMac().Sign(m, One(p));
    signed_bytes = EncodeChunkHeader(m).substr(0, kChunkMacCoveredHeaderBytes) + p;
    signed_tag = m.mac;
  };
  switch (mutation) {
    case 0: {  // a header field, through the encoder (the header checksum stays valid)
      ChunkHeader m = header;
      std::string p = payload;
      switch (where % 10) {
        case 0:
          m.layout_version = static_cast<uint32_t>(value);
          break;
        case 1:
          m.layout.num_layers = static_cast<uint32_t>(value);
          break;
        case 2:
          m.layout.n_kv_heads = static_cast<uint32_t>(value);
          break;
        case 3:
          m.layout.head_dim = static_cast<uint32_t>(value);
          break;
        case 4:
          m.layout.num_tokens = static_cast<uint32_t>(value);
          break;
        case 5:
          m.layout.anchor_tokens = static_cast<uint32_t>(value);
          break;
        case 6:
          m.layout.dtype = static_cast<KvDtype>(static_cast<uint32_t>(value));
          break;
        case 7:
          m.payload_bytes = value;
          break;
        case 8:
          m.payload_checksum = value;
          break;
        default:
          m.key.low = value;
          break;
      }
      if (resign) sign_with_test_key(m, p);
      mutated = EncodeChunk(m, p);
      break;
    }
    case 1: {  // a raw header byte (magic, version, header size too), checksum recomputed
      mutated = stored;
      mutated[where % kHeaderChecksumOffset] = static_cast<char>(value);
      const uint64_t checksum = XXH3_64bits(mutated.data(), kHeaderChecksumOffset);
      std::memcpy(mutated.data() + kHeaderChecksumOffset, &checksum, sizeof(checksum));
      break;
    }
    case 2:  // truncated
      mutated = stored.substr(0, where % (stored.size() + 1));
      break;
    case 3:  // trailing bytes
      mutated = stored + std::string(1 + value % 16, static_cast<char>(where));
      break;
    case 4:  // a flipped bit anywhere, nothing recomputed
      mutated = stored;
      mutated[where % mutated.size()] ^= static_cast<char>(1 << (value % 8));
      break;
    case 5: {  // a layout with large dimensions whose size may wrap 64 bits
      ChunkLayout big = layout;
      big.num_layers = SomeU32(in);
      big.n_kv_heads = SomeU32(in);
      big.head_dim = SomeU32(in);
      big.num_tokens = SomeU32(in);
      if (big.payload_bytes() > 4096) return;  // too large to build (wrapped or not)
      std::string p(big.payload_bytes(), '\0');
      for (size_t i = 0; !source.empty() && i < p.size(); ++i) p[i] = source[i % source.size()];
      ChunkHeader m = MakeChunkHeader(key, fingerprint, big, p);
      if (sign) sign_with_test_key(m, p);
      mutated = EncodeChunk(m, p);
      break;
    }
    default: {  // the tag replaced
      mutated = stored;
      for (size_t i = 0; i < kChunkMacBytes; ++i) mutated[kMacOffset + i] = static_cast<char>(value >> (8 * (i % 8)));
      break;
    }
  }
  const absl::StatusOr<ChunkView> view = DecodeChunk(mutated);
  if (!view.ok()) return;
  CheckDecoded(mutated, *view, in);
  const bool covered_as_signed =
      signed_now && mutated.substr(0, kChunkMacCoveredHeaderBytes) + std::string(view->payload) == signed_bytes &&
      view->header.mac == signed_tag;
  FUZZ_CHECK(TestMac().Verify(view->header, One(view->payload)).ok() == covered_as_signed);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  FuzzedDataProvider raw_cuts(data, size);
  Raw(bytes, raw_cuts);
  FuzzedDataProvider in(data, size);
  Structured(in);
  (void)ParseKvDtype(bytes.substr(0, 8));
  return 0;
}
