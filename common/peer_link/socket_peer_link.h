// The "socket" kind of peer_link.h, the CPU twin of the NCCL link: host memory over a Unix
// stream socket in the abstract namespace (named by the id), with the same ordering,
// deadline and failure rules. The sender listens, the receiver connects. Each transfer is
// framed by its total size, so that a Recv of another size fails (INTERNAL) rather than
// reading misaligned bytes.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/peer_link/peer_link.h"

namespace lazykv {

absl::StatusOr<std::string> NewSocketPeerLinkId();
absl::StatusOr<std::unique_ptr<PeerLink>> ConnectSocketPeerLink(std::string_view id, int rank,
                                                                PeerLinkClock::time_point deadline,
                                                                const std::atomic<bool>* cancel = nullptr);

}  // namespace lazykv
