// The "nccl" kind where the build has no CUDA or no nccl.h: every call says so.
#include "common/peer_link/nccl_peer_link.h"

namespace lazykv {
namespace {

absl::Status Unavailable() {
  return absl::FailedPreconditionError("this build has no NCCL (built without CUDA or without nccl.h)");
}

}  // namespace

absl::Status NcclPeerLinkAvailable() { return Unavailable(); }

absl::StatusOr<std::string> NewNcclPeerLinkId() { return Unavailable(); }

absl::StatusOr<std::unique_ptr<PeerLink>> ConnectNcclPeerLink(int, std::string_view, int, PeerLinkClock::time_point,
                                                              const std::atomic<bool>*) {
  return Unavailable();
}

}  // namespace lazykv
