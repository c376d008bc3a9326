#include "worker/tier/fetch_transport.h"

#include "absl/strings/str_format.h"

namespace lazykv {

absl::StatusOr<FetchTransport> ParseFetchTransport(std::string_view name) {
  if (name == "auto") return FetchTransport::kAuto;
  if (name == "grpc") return FetchTransport::kGrpc;
  if (name == "shm") return FetchTransport::kShm;
  if (name == "nccl") return FetchTransport::kNccl;
  return absl::InvalidArgumentError(absl::StrFormat("--transport '%s': expected auto, grpc, shm or nccl", name));
}

const char* FetchTransportName(FetchTransport transport) {
  switch (transport) {
    case FetchTransport::kGrpc:
      return "grpc";
    case FetchTransport::kShm:
      return "shm";
    case FetchTransport::kNccl:
      return "nccl";
    case FetchTransport::kAuto:
      break;
  }
  return "auto";
}

}  // namespace lazykv
