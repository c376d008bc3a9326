#include "common/peer_link/peer_link.h"

#include "absl/strings/str_cat.h"
#include "common/peer_link/nccl_peer_link.h"
#include "common/peer_link/socket_peer_link.h"

namespace lazykv {

absl::Status PeerLinkAvailable(std::string_view kind) {
  if (kind == "socket") return absl::OkStatus();
  if (kind == "nccl") return NcclPeerLinkAvailable();
  return absl::InvalidArgumentError(absl::StrCat("unknown peer link kind \"", std::string(kind), "\""));
}

absl::StatusOr<std::string> NewPeerLinkId(const PeerLinkOptions& options) {
  if (options.kind == "socket") return NewSocketPeerLinkId();
  if (options.kind == "nccl") return NewNcclPeerLinkId();
  return PeerLinkAvailable(options.kind);
}

absl::StatusOr<std::unique_ptr<PeerLink>> ConnectPeerLink(const PeerLinkOptions& options, std::string_view id, int rank,
                                                          PeerLinkClock::time_point deadline) {
  if (rank != 0 && rank != 1) return absl::InvalidArgumentError(absl::StrCat("peer link rank ", rank, " is not 0 or 1"));
  if (options.kind == "socket") return ConnectSocketPeerLink(id, rank, deadline, options.cancel.get());
  if (options.kind == "nccl") return ConnectNcclPeerLink(options.device, id, rank, deadline, options.cancel.get());
  return PeerLinkAvailable(options.kind);
}

}  // namespace lazykv
