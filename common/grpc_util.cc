#include "common/grpc_util.h"

namespace lazykv {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl and gRPC share the canonical code numbering.
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

v1::Hash128 ToProto(const Hash128& hash) {
  v1::Hash128 out;
  out.set_high(hash.high);
  out.set_low(hash.low);
  return out;
}

Hash128 FromProto(const v1::Hash128& hash) { return Hash128{hash.high(), hash.low()}; }

}  // namespace lazykv
