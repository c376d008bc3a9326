// The "nccl" kind of peer_link.h: a two-rank NCCL communicator (non-blocking, so that every
// wait has a deadline and ends in ncclCommAbort rather than a hang), its own CUDA stream,
// and a sender thread that runs queued transfers in order as grouped ncclSend calls. Built
// with CUDA (nccl_peer_link_cuda.cc); elsewhere every call says it is unavailable
// (nccl_peer_link_none.cc). Called through peer_link.h's functions, not directly.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/peer_link/peer_link.h"

namespace lazykv {

absl::Status NcclPeerLinkAvailable();
absl::StatusOr<std::string> NewNcclPeerLinkId();  // ncclGetUniqueId's 128 bytes
absl::StatusOr<std::unique_ptr<PeerLink>> ConnectNcclPeerLink(int device, std::string_view id, int rank,
                                                              PeerLinkClock::time_point deadline,
                                                              const std::atomic<bool>* cancel = nullptr);

}  // namespace lazykv
