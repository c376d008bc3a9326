// A point-to-point byte link between two processes (DESIGN.md section 5): a cache server's
// GPU tier (rank 0, the sender) and a worker's GPU (rank 1, the receiver), for chunks that
// cross GPUs. Two kinds:
//   "nccl":   device memory on both sides, NCCL send/receive (NVLink, PCIe or the network),
//             the library loaded at run time (nccl_library.h); unavailable without it.
//   "socket": host memory over a Unix socket; the CPU twin, for tests and for GPU tiers
//             emulated in host memory, with the same matching and failure rules.
// The sender makes an id (NewPeerLinkId), passes it to the receiver out of band (the gRPC
// session), and both join it (ConnectPeerLink). Matching: the receiver's i-th Recv takes the
// sender's i-th Send, whose bytes are the concatenation of its pieces; the pieces on either
// side are a gather or scatter list of the same total size, and need not line up. (One
// transfer moves as one unit: NCCL pays about 10 us per send it pairs, so 32 pages sent as
// 32 sends ran at a third of one send's rate on an H200 pair; the NCCL link gathers and
// scatters on the GPU instead.)
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace lazykv {

using PeerLinkClock = std::chrono::steady_clock;

struct PeerLinkOptions {
  std::string kind = "nccl";  // "nccl" or "socket"
  int device = 0;             // this side's CUDA device ("nccl")
  // Set (by another thread) to give up a join under way: ConnectPeerLink then returns
  // CANCELLED within milliseconds (a session closed, a server shutting down). May be null.
  std::shared_ptr<const std::atomic<bool>> cancel;
};

// Thread-safe: Send, Abort, alive and kind from any thread; Recv from one thread at a time.
class PeerLink {
 public:
  virtual ~PeerLink() = default;  // aborts what is in flight or queued
  // Queues one transfer of `pieces` (this side's memory: device memory for "nccl"; each
  // must stay valid and unchanged until `done` runs). Returns at once; transfers go in
  // the order queued. `done` runs exactly once, on the link's own thread (or on the
  // caller's when the link is dead already): OK once the pieces' memory may be reused (the
  // bytes have left it: NCCL may finish a send the peer's buffers can hold before the peer
  // receives it); otherwise DEADLINE_EXCEEDED (the link is aborted), ABORTED (Abort, the
  // peer went away) or the library's error. A failed transfer kills the link.
  virtual void Send(std::vector<std::string_view> pieces, PeerLinkClock::time_point deadline,
                    std::function<void(absl::Status)> done) = 0;
  // Receives one transfer into `pieces`, blocking until every byte is in or the deadline
  // passes (then the link is aborted: DEADLINE_EXCEEDED). Pieces of zero bytes are allowed.
  // After any error the link is dead and every later call fails at once.
  virtual absl::Status Recv(std::vector<std::span<char>> pieces, PeerLinkClock::time_point deadline) = 0;
  // False once a transfer failed or Abort was called.
  virtual bool alive() const = 0;
  // Ends every transfer in flight or queued with ABORTED; the link is dead afterwards.
  // Idempotent. Never waits for the peer.
  virtual void Abort() = 0;
  virtual std::string_view kind() const = 0;
};

// OK when links of `kind` can be made here; FAILED_PRECONDITION naming what is missing
// (the NCCL library, a GPU, a build with CUDA) or INVALID_ARGUMENT for an unknown kind.
absl::Status PeerLinkAvailable(std::string_view kind);

// The sender's side: a fresh id for one link (opaque bytes, to be sent to the peer).
absl::StatusOr<std::string> NewPeerLinkId(const PeerLinkOptions& options);

// Joins the link named by `id` as `rank` (0: sender, 1: receiver). Blocks until both sides
// have joined, `deadline` passes (DEADLINE_EXCEEDED) or options.cancel is set (CANCELLED);
// nothing is left behind but, for NCCL, the rendezvous thread the id started when the
// other side never joined.
// INVALID_ARGUMENT for a malformed id or rank; FAILED_PRECONDITION as PeerLinkAvailable.
absl::StatusOr<std::unique_ptr<PeerLink>> ConnectPeerLink(const PeerLinkOptions& options, std::string_view id, int rank,
                                                          PeerLinkClock::time_point deadline);

}  // namespace lazykv
