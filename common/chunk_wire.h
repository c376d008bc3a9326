// Zero-copy wire forms of KvCache.Get's GetResponse (proto/kvcache.proto) for the chunk
// data path. The generated message would copy a MiB-sized payload twice on each side
// (into the message, then into gRPC's buffer, and back); these types speak the same
// protobuf wire format directly:
// - OutgoingGetResponse (server): gRPC slices that reference the stored bytes, kept
//   alive by `owner` until sent.
// - IncomingGetResponse (client): each message's header and payload appended straight
//   from gRPC's receive buffer into one string.
// Any client or server using the generated GetResponse interoperates with these.
#pragma once

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <grpcpp/impl/serialization_traits.h>
#include <grpcpp/support/byte_buffer.h>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "proto/kvcache.grpc.pb.h"

namespace lazykv {

struct OutgoingGetResponse {
  std::string header;                    // field 1: first message only
  v1::Tier tier = v1::TIER_UNSPECIFIED;  // field 2
  std::vector<std::string_view> data;    // field 3: these pieces, concatenated
  std::shared_ptr<const void> owner;     // keeps `data` valid until gRPC lets go of it
};

struct IncomingGetResponse {
  std::string* out = nullptr;  // header, then payload, appended here
  v1::Tier tier = v1::TIER_UNSPECIFIED;
};

// KvCache.Get into `stored` (header + payload) over `channel`, through IncomingGetResponse.
// DATA_LOSS (the call cancelled) once the server sends more than its header announced, or
// more than `max_bytes` in all.
grpc::Status GetChunkInto(grpc::ChannelInterface* channel, grpc::ClientContext* context, const v1::GetRequest& request,
                          std::string* stored, v1::Tier* tier, uint64_t max_bytes = uint64_t{4} << 30);

// KvCache.Put of a chunk given as its header bytes and payload: the first message carries
// key, fingerprint, lease and header, then `slice_bytes` of payload per message.
grpc::Status PutChunkSlices(v1::KvCache::Stub& stub, grpc::ClientContext* context, const v1::Hash128& key,
                            const v1::Hash128& model_fingerprint, uint64_t lease_id, std::string_view header,
                            std::string_view payload, size_t slice_bytes, v1::PutResponse* response);

}  // namespace lazykv

namespace grpc {

template <>
class SerializationTraits<lazykv::OutgoingGetResponse, void> {
 public:
  static Status Serialize(const lazykv::OutgoingGetResponse& message, ByteBuffer* buffer, bool* own_buffer);
  static Status Deserialize(ByteBuffer*, lazykv::OutgoingGetResponse*) {
    return Status(StatusCode::UNIMPLEMENTED, "OutgoingGetResponse is send-only");
  }
};

template <>
class SerializationTraits<lazykv::IncomingGetResponse, void> {
 public:
  static Status Serialize(const lazykv::IncomingGetResponse&, ByteBuffer*, bool*) {
    return Status(StatusCode::UNIMPLEMENTED, "IncomingGetResponse is receive-only");
  }
  static Status Deserialize(ByteBuffer* buffer, lazykv::IncomingGetResponse* message);
};

}  // namespace grpc
