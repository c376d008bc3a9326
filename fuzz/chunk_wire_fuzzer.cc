// chunk_wire_fuzzer: the receiving side of the zero-copy KvCache.Get wire form
// (common/chunk_wire.h: SerializationTraits<IncomingGetResponse>::Deserialize), which
// parses GetResponse messages straight from gRPC's receive buffer on a worker, i.e. bytes
// a cache server (or anyone on the path) chose.
//
// Each input is used twice:
// - raw: the bytes, as one message cut into gRPC slices at points the input picks, go to
//   Deserialize, with the output string empty or already holding a header (a later
//   message of the stream);
// - structured: the input picks a chunk header (a small layout, or one time in eight a
//   huge one; made valid by the project's EncodeChunkHeader, so that Deserialize's header
//   decoding and its reservation are reached), a tier and payload pieces; OutgoingGetResponse's Serialize (the server side)
//   encodes them, optionally with one byte changed, truncated or extended, and Deserialize
//   reads them back.
// Invariants (abort on violation):
// - whatever size a header claims, Deserialize neither throws nor allocates more than
//   libFuzzer's -malloc_limit_mb (which defaults to -rss_limit_mb);
// - the result (status, output, tier) does not depend on how the message is cut into slices;
// - an accepted message only appends to the output, at most as many bytes as it holds;
// - what Serialize wrote, Deserialize reads back unchanged (header then payload, tier),
//   and protobuf's generated v1::GetResponse parses it to the same fields.
#include <fuzzer/FuzzedDataProvider.h>
#include <grpcpp/impl/grpc_library.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <string>
#include <string_view>
#include <vector>

#include "common/chunk_codec.h"
#include "common/chunk_wire.h"
#include "fuzz/fuzz_util.h"

namespace {

using namespace lazykv;
using Traits = grpc::SerializationTraits<IncomingGetResponse, void>;
using OutgoingTraits = grpc::SerializationTraits<OutgoingGetResponse, void>;

// What the generated code's static initializers do: makes gRPC's codegen interface
// (behind ByteBuffer and Slice) available before the first input.
grpc::internal::GrpcLibraryInitializer g_grpc_library;

struct Parsed {
  bool ok = false;
  std::string out;
  v1::Tier tier = v1::TIER_UNSPECIFIED;
  friend bool operator==(const Parsed&, const Parsed&) = default;
};

// Deserializes `bytes` given as slices cut at `cuts` (sorted offsets), into an output
// that starts as `prefix`.
Parsed Deserialize(std::string_view bytes, const std::vector<size_t>& cuts, const std::string& prefix) {
  std::vector<grpc::Slice> slices;
  size_t at = 0;
  for (size_t cut : cuts) {
    slices.emplace_back(bytes.data() + at, cut - at);
    at = cut;
  }
  slices.emplace_back(bytes.data() + at, bytes.size() - at);
  grpc::ByteBuffer buffer(slices.data(), slices.size());
  Parsed parsed;
  parsed.out = prefix;
  IncomingGetResponse message{&parsed.out};
  parsed.ok = Traits::Deserialize(&buffer, &message).ok();
  parsed.tier = message.tier;
  return parsed;
}

std::vector<size_t> Cuts(size_t size, FuzzedDataProvider& in) {
  std::vector<size_t> cuts;
  const int n = in.ConsumeIntegralInRange<int>(0, 6);
  size_t at = 0;
  for (int i = 0; i < n; ++i) {
    at = in.ConsumeIntegralInRange<size_t>(at, size);
    cuts.push_back(at);  // equal cuts make empty slices
  }
  return cuts;
}

// Parses `bytes` whole and cut, checks the two agree and what an accepted message may do.
Parsed ParseBothWays(std::string_view bytes, const std::string& prefix, FuzzedDataProvider& in) {
  const Parsed whole = Deserialize(bytes, {}, prefix);
  const Parsed cut = Deserialize(bytes, Cuts(bytes.size(), in), prefix);
  FUZZ_CHECK(whole == cut);
  if (whole.ok) {
    FUZZ_CHECK(whole.out.compare(0, prefix.size(), prefix) == 0);
    FUZZ_CHECK(whole.out.size() <= prefix.size() + bytes.size());
  }
  return whole;
}

// A dimension: small, or (when `huge`) a power of two or any uint32.
uint32_t Dim(FuzzedDataProvider& in, bool huge) {
  switch (huge ? in.ConsumeIntegralInRange<int>(0, 2) : 0) {
    case 0: return in.ConsumeIntegralInRange<uint32_t>(0, 16);
    case 1: return 1u << in.ConsumeIntegralInRange<int>(0, 31);
    default: return in.ConsumeIntegral<uint32_t>();
  }
}

void Structured(FuzzedDataProvider& in) {
  // One header in eight claims a huge payload (Deserialize's reservation; slow under ASan).
  const bool huge = in.ConsumeIntegralInRange<int>(0, 7) == 0;
  ChunkLayout layout;
  layout.num_layers = Dim(in, huge);
  layout.n_kv_heads = Dim(in, huge);
  layout.head_dim = Dim(in, huge);
  layout.num_tokens = Dim(in, huge);
  layout.anchor_tokens = in.ConsumeIntegral<uint32_t>();
  layout.dtype = static_cast<KvDtype>(in.ConsumeIntegralInRange<uint32_t>(1, 3));
  ChunkHeader header;
  header.key = {in.ConsumeIntegral<uint64_t>(), in.ConsumeIntegral<uint64_t>()};
  header.layout = layout;
  header.payload_bytes = layout.payload_bytes();  // what DecodeChunkHeader checks
  header.payload_checksum = in.ConsumeIntegral<uint64_t>();

  OutgoingGetResponse message;
  if (in.ConsumeBool()) message.header = EncodeChunkHeader(header);
  if (in.ConsumeBool()) message.header = in.ConsumeRandomLengthString(200);  // any bytes as the header field
  message.tier = static_cast<v1::Tier>(in.ConsumeIntegralInRange<int>(0, 4));
  std::vector<std::string> pieces(in.ConsumeIntegralInRange<int>(0, 4));
  for (std::string& piece : pieces) {
    piece = in.ConsumeRandomLengthString(512);
    message.data.push_back(piece);
  }
  const int mutation = in.ConsumeIntegralInRange<int>(0, 3);
  const uint32_t where = in.ConsumeIntegral<uint32_t>();
  const uint8_t value = in.ConsumeIntegral<uint8_t>();
  const std::string prefix = in.ConsumeBool() ? std::string() : std::string(kChunkHeaderBytes, 'h');

  grpc::ByteBuffer buffer;
  bool own = false;
  FUZZ_CHECK(OutgoingTraits::Serialize(message, &buffer, &own).ok());
  std::vector<grpc::Slice> slices;
  FUZZ_CHECK(buffer.Dump(&slices).ok());
  std::string wire;
  for (const grpc::Slice& s : slices) wire.append(reinterpret_cast<const char*>(s.begin()), s.size());

  // The header field is appended as it comes (after an earlier message's header, too).
  std::string expected = prefix + message.header;
  for (const std::string& piece : pieces) expected += piece;
  if (mutation == 0 || wire.empty()) {  // as sent
    const Parsed parsed = ParseBothWays(wire, prefix, in);
    FUZZ_CHECK(parsed.ok);
    FUZZ_CHECK(parsed.out == expected);
    FUZZ_CHECK(parsed.tier == message.tier);
    v1::GetResponse generated;
    FUZZ_CHECK(generated.ParseFromString(wire));
    FUZZ_CHECK(generated.header() == message.header);
    FUZZ_CHECK(generated.tier() == message.tier);
    FUZZ_CHECK(prefix + generated.header() + generated.data() == expected);
    return;
  }
  switch (mutation) {
    case 1: wire[where % wire.size()] = static_cast<char>(value); break;
    case 2: wire.resize(where % wire.size()); break;
    default: wire.append(std::string(1 + value % 8, static_cast<char>(where))); break;
  }
  (void)ParseBothWays(wire, prefix, in);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  FuzzedDataProvider cuts(data, size);
  (void)ParseBothWays(bytes, "", cuts);
  (void)ParseBothWays(bytes, std::string(kChunkHeaderBytes, 'h'), cuts);
  FuzzedDataProvider in(data, size);
  Structured(in);
  return 0;
}
