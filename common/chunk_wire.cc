#include "common/chunk_wire.h"

#include <grpcpp/impl/codegen/proto_utils.h>
#include <grpcpp/impl/rpc_method.h>
#include <grpcpp/support/sync_stream.h>

#include <atomic>

#include "absl/strings/str_format.h"
#include "common/chunk_codec.h"

namespace lazykv {
namespace {

// Protobuf wire tags of GetResponse's fields: (field << 3) | wire type.
constexpr uint8_t kHeaderTag = (1 << 3) | 2;
constexpr uint8_t kTierTag = (2 << 3) | 0;
constexpr uint8_t kDataTag = (3 << 3) | 2;

// The most a received header makes Deserialize reserve ahead of the payload.
constexpr uint64_t kMaxReserveBytes = uint64_t{1} << 30;

void PutVarint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>(value | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}

// Reads across the slices of a received message.
class SliceReader {
 public:
  explicit SliceReader(std::vector<grpc::Slice> slices) : slices_(std::move(slices)) { Skip(); }
  bool done() const { return index_ == slices_.size(); }
  bool Byte(uint8_t* b) {
    if (done()) return false;
    *b = slices_[index_].begin()[offset_++];
    Skip();
    return true;
  }
  bool Varint(uint64_t* value) {
    *value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      uint8_t b;
      if (!Byte(&b)) return false;
      *value |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return true;
    }
    return false;
  }
  // Appends (or, with out == nullptr, skips) the next n bytes.
  bool Take(uint64_t n, std::string* out) {
    while (n > 0) {
      if (done()) return false;
      const grpc::Slice& s = slices_[index_];
      const size_t k = std::min<uint64_t>(n, s.size() - offset_);
      if (out != nullptr) out->append(reinterpret_cast<const char*>(s.begin()) + offset_, k);
      offset_ += k;
      n -= k;
      Skip();
    }
    return true;
  }

 private:
  void Skip() {
    while (index_ < slices_.size() && offset_ == slices_[index_].size()) {
      ++index_;
      offset_ = 0;
    }
  }
  std::vector<grpc::Slice> slices_;
  size_t index_ = 0, offset_ = 0;
};

// What keeps a zero-copy slice's bytes alive, freed by whichever gRPC thread drops the
// slice last. gRPC hands slices between its threads with synchronization that
// ThreadSanitizer cannot see (Debian's gRPC is not instrumented), so the handoff is
// stated here: a release store when the owner is made, an acquire load before it is
// freed (free on x86: plain moves).
struct SliceOwner {
  explicit SliceOwner(std::shared_ptr<const void> bytes) : bytes(std::move(bytes)) {
    handed_off.store(true, std::memory_order_release);
  }
  std::shared_ptr<const void> bytes;
  std::atomic<bool> handed_off{false};
};

void ReleaseOwner(void* owner) {
  auto* slice_owner = static_cast<SliceOwner*>(owner);
  (void)slice_owner->handed_off.load(std::memory_order_acquire);
  delete slice_owner;
}

}  // namespace

grpc::Status GetChunkInto(grpc::ChannelInterface* channel, grpc::ClientContext* context, const v1::GetRequest& request,
                          std::string* stored, v1::Tier* tier, uint64_t max_bytes) {
  static const grpc::internal::RpcMethod kGet("/lazykv.v1.KvCache/Get", grpc::internal::RpcMethod::SERVER_STREAMING);
  std::unique_ptr<grpc::ClientReader<IncomingGetResponse>> reader(
      grpc::internal::ClientReaderFactory<IncomingGetResponse>::Create(channel, kGet, context, request));
  IncomingGetResponse message{stored};
  // The peer streams as much as it likes: what passes the size its own header announced
  // (or max_bytes) ends the call, so a hostile or broken server cannot fill this memory.
  uint64_t announced = max_bytes;
  bool header_seen = false;
  while (reader->Read(&message)) {
    if (!header_seen && stored->size() >= kChunkHeaderBytes) {
      header_seen = true;
      if (auto header = DecodeChunkHeader(std::string_view(*stored).substr(0, kChunkHeaderBytes)); header.ok()) {
        announced = std::min(announced, kChunkHeaderBytes + header->payload_bytes);
      }
    }
    if (stored->size() > announced) {
      context->TryCancel();
      reader->Finish();
      return grpc::Status(grpc::StatusCode::DATA_LOSS,
                          absl::StrFormat("get: the server sent more than the %d bytes announced", announced));
    }
  }
  *tier = message.tier;
  return reader->Finish();
}

grpc::Status PutChunkSlices(v1::KvCache::Stub& stub, grpc::ClientContext* context, const v1::Hash128& key,
                            const v1::Hash128& model_fingerprint, uint64_t lease_id, std::string_view header,
                            std::string_view payload, size_t slice_bytes, v1::PutResponse* response) {
  auto writer = stub.Put(context, response);
  v1::PutRequest message;
  *message.mutable_key() = key;
  *message.mutable_model_fingerprint() = model_fingerprint;
  message.set_lease_id(lease_id);
  message.set_header(header.data(), header.size());
  size_t offset = 0;
  do {
    const size_t n = std::min(slice_bytes, payload.size() - offset);
    message.set_data(payload.data() + offset, n);
    offset += n;
    if (!writer->Write(message)) break;  // the server answered early (stored, or an error)
    message.Clear();
  } while (offset < payload.size());
  writer->WritesDone();
  return writer->Finish();
}

}  // namespace lazykv

namespace grpc {

Status SerializationTraits<lazykv::OutgoingGetResponse, void>::Serialize(const lazykv::OutgoingGetResponse& message,
                                                                         ByteBuffer* buffer, bool* own_buffer) {
  std::string prefix;
  if (!message.header.empty()) {
    prefix.push_back(static_cast<char>(lazykv::kHeaderTag));
    lazykv::PutVarint(prefix, message.header.size());
    prefix += message.header;
  }
  if (message.tier != lazykv::v1::TIER_UNSPECIFIED) {
    prefix.push_back(static_cast<char>(lazykv::kTierTag));
    lazykv::PutVarint(prefix, static_cast<uint64_t>(message.tier));
  }
  size_t data_bytes = 0;
  for (std::string_view piece : message.data) data_bytes += piece.size();
  if (data_bytes > 0) {
    prefix.push_back(static_cast<char>(lazykv::kDataTag));
    lazykv::PutVarint(prefix, data_bytes);
  }
  std::vector<Slice> slices;
  slices.emplace_back(prefix);
  for (std::string_view piece : message.data) {
    if (piece.empty()) continue;
    slices.emplace_back(const_cast<char*>(piece.data()), piece.size(), lazykv::ReleaseOwner,
                        new lazykv::SliceOwner(message.owner));
  }
  *buffer = ByteBuffer(slices.data(), slices.size());
  *own_buffer = true;
  return Status::OK;
}

Status SerializationTraits<lazykv::IncomingGetResponse, void>::Deserialize(ByteBuffer* buffer,
                                                                           lazykv::IncomingGetResponse* message) {
  std::vector<Slice> slices;
  if (!buffer->Dump(&slices).ok()) return Status(StatusCode::INTERNAL, "cannot read a GetResponse buffer");
  buffer->Clear();
  lazykv::SliceReader in(std::move(slices));
  const Status malformed(StatusCode::INTERNAL, "malformed GetResponse");
  while (!in.done()) {
    uint64_t tag, length;
    if (!in.Varint(&tag)) return malformed;
    switch (tag & 7) {
      case 0: {  // varint
        uint64_t value;
        if (!in.Varint(&value)) return malformed;
        if (tag == lazykv::kTierTag) message->tier = static_cast<lazykv::v1::Tier>(value);
        break;
      }
      case 2: {  // length-delimited
        if (!in.Varint(&length)) return malformed;
        const bool wanted = tag == lazykv::kHeaderTag || tag == lazykv::kDataTag;
        if (tag == lazykv::kHeaderTag && message->out->empty()) {
          if (!in.Take(length, message->out)) return malformed;
          // The header says how large the whole chunk is: one allocation for it. The peer
          // wrote that size, so it is capped (a larger chunk grows as its bytes arrive):
          // a header claiming a terabyte must not make this throw or take the memory.
          if (auto header = lazykv::DecodeChunkHeader(*message->out); header.ok()) {
            message->out->reserve(lazykv::kChunkHeaderBytes + std::min(header->payload_bytes, lazykv::kMaxReserveBytes));
          }
          break;
        }
        if (!in.Take(length, wanted ? message->out : nullptr)) return malformed;
        break;
      }
      case 1:
        if (!in.Take(8, nullptr)) return malformed;
        break;
      case 5:
        if (!in.Take(4, nullptr)) return malformed;
        break;
      default:
        return malformed;
    }
  }
  return Status::OK;
}

}  // namespace grpc
