#include "worker/tier/fetch_transport.h"

#include "absl/strings/str_format.h"

namespace lazykv {

absl::StatusOr<FetchTransport> ParseFetchTransport(std::string_view name) {
  if (name == "auto") return FetchTransport::kAuto;
  if (name == "grpc") return FetchTransport::kGrpc;
  if (name == "shm") return FetchTransport::kShm;
  return absl::InvalidArgumentError(absl::StrFormat("--transport '%s': expected auto, grpc or shm", name));
}

const char* FetchTransportName(FetchTransport transport) {
  switch (transport) {
    case FetchTransport::kGrpc:
      return "grpc";
    case FetchTransport::kShm:
      return "shm";
    case FetchTransport::kAuto:
      break;
  }
  return "auto";
}

}  // namespace lazykv
