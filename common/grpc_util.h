// The seam between the project's absl::Status idiom and gRPC: status conversion both
// ways and the wire form of 128-bit hashes.
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "common/chunk_key.h"
#include "proto/kvcache.pb.h"

namespace lazykv {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

v1::Hash128 ToProto(const Hash128& hash);
Hash128 FromProto(const v1::Hash128& hash);

}  // namespace lazykv
