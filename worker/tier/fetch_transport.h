// How a worker fetches chunks from a cache server (DESIGN.md section 5): `auto` reads a
// server on the same host in place from its shared host arena (shm) and streams from any
// other over gRPC; `grpc` and `shm` force one (with `shm`, a fetch that cannot go over
// shared memory is a miss: the chunk is computed).
#pragma once

#include <string_view>

#include "absl/status/statusor.h"

namespace lazykv {

enum class FetchTransport { kAuto, kGrpc, kShm };

absl::StatusOr<FetchTransport> ParseFetchTransport(std::string_view name);  // "auto", "grpc", "shm"
const char* FetchTransportName(FetchTransport transport);

}  // namespace lazykv
