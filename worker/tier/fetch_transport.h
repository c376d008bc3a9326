// How a worker fetches chunks from a cache server (DESIGN.md section 5): `auto` reads a
// server on the same host in place from its shared host arena (shm; a chunk in its GPU
// tier device to device through CUDA IPC when this worker's GPU can open it, else over an
// NCCL link) and streams from any other over gRPC (a chunk in its GPU tier over an NCCL
// link); `grpc` and `shm` force one (with `shm`, a fetch that cannot go over shared memory
// is a miss: the chunk is computed); `nccl` fetches a chunk in a server's GPU tier over an
// NCCL link, never CUDA IPC, and the others as auto does.
#pragma once

#include <string_view>

#include "absl/status/statusor.h"

namespace lazykv {

enum class FetchTransport { kAuto, kGrpc, kShm, kNccl };

absl::StatusOr<FetchTransport> ParseFetchTransport(std::string_view name);  // "auto", "grpc", "shm", "nccl"
const char* FetchTransportName(FetchTransport transport);

}  // namespace lazykv
