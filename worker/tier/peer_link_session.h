// A worker's peer link session with one cache server (DESIGN.md section 5): the
// PeerLinkSession stream, held open as long as this object lives, and the link joined as
// the receiver (rank 1) of chunks from the server's GPU tier. A chunk comes as PeerGet's
// answer (its header, and the sizes of the pieces queued on the link) and then its payload
// over the link, into a staging buffer: on this worker's GPU for an NCCL link (the chunk's
// bytes then have a device tail, as a CUDA IPC fetch's do), in host memory for the socket
// twin. The buffer goes back to its pool when the last copy of the bytes goes.
//
// The session opens on its own thread (an NCCL communicator takes a second or more to
// come up), so no fetch waits for it; fetches use it once it is ready. A fetch that fails
// anywhere after its PeerGet was sent ends the session: the server may have queued bytes
// that were never received, and the link is out of step.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "common/chunk_bytes.h"
#include "common/chunk_key.h"
#include "common/mutex.h"
#include "common/peer_link/peer_link.h"
#include "proto/kvcache.grpc.pb.h"
#include "worker/tier/staging_pool.h"

namespace lazykv {

// Thread-safe. Kept alive by the chunk bytes it handed out only through their staging
// buffers (never the session itself): a session may end while its chunks live on.
class PeerLinkClientSession {
 public:
  enum class State { kOpening, kReady, kEnded };
  // Starts opening a session on `channel` with a link of `link.kind` on `link.device`;
  // returns at once. The server must answer within `answer_timeout`, and the link come up
  // within the server's join timeout.
  // `buffer_bytes`: the receive buffer a fetch takes first (grown to the largest chunk seen).
  static std::shared_ptr<PeerLinkClientSession> Start(std::shared_ptr<grpc::Channel> channel, std::string holder,
                                                      PeerLinkOptions link, std::shared_ptr<StagingPool> staging,
                                                      std::chrono::milliseconds answer_timeout,
                                                      uint64_t buffer_bytes = 64ull << 20);
  ~PeerLinkClientSession();  // ends the stream and aborts the link

  State state() const ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status ended_status() const ABSL_LOCKS_EXCLUDED(mu_);  // why it ended (kEnded only)
  uint64_t id() const ABSL_LOCKS_EXCLUDED(mu_);
  const std::string& kind() const { return link_options_.kind; }
  // Fetches under way or waiting their turn (a caller with several sessions picks the least busy).
  int in_flight() const { return in_flight_.load(); }

  // The PeerGet call (the caller's stub, deadline and accounting): the request is filled in.
  using PeerGetCall = std::function<absl::Status(const v1::PeerGetRequest&, v1::PeerGetResponse*)>;
  // Fetches `key`: PeerGet through `call`, then its payload over the link by
  // `transfer_deadline`. One fetch at a time per session (others wait their turn).
  // NOT_FOUND: the server's GPU tier does not hold it; RESOURCE_EXHAUSTED: no receive
  // buffer (a chunk larger than the one taken is asked for again with a larger one);
  // FAILED_PRECONDITION: the session is not ready or has ended. With these nothing was sent
  // and the session lives on; any other error ends it.
  // *setup_seconds (may be null): of the fetch's time, what went to allocating a receive
  // buffer (once per buffer: not the link's cost per chunk).
  absl::StatusOr<ChunkBytes> Fetch(const Hash128& key, const PeerGetCall& call,
                                   PeerLinkClock::time_point transfer_deadline, double* setup_seconds = nullptr)
      ABSL_LOCKS_EXCLUDED(fetch_mu_, mu_);
  // Ends the session now (its stream and link).
  void End(absl::Status why) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  PeerLinkClientSession(PeerLinkOptions link, std::shared_ptr<StagingPool> staging)
      : link_options_(WithGiveUp(std::move(link), give_up_)), staging_(std::move(staging)) {}
  static PeerLinkOptions WithGiveUp(PeerLinkOptions link, std::shared_ptr<const std::atomic<bool>> flag) {
    link.cancel = std::move(flag);
    return link;
  }
  void Run(std::shared_ptr<grpc::Channel> channel, std::string holder, std::chrono::milliseconds answer_timeout);
  absl::StatusOr<ChunkBytes> Receive(const v1::PeerGetResponse& answer, std::shared_ptr<StagingBuffer> buffer,
                                     PeerLinkClock::time_point deadline);

  // Set by End: a join under way gives up, so that End and the destructor do not wait out
  // the server's join timeout. Declared first: link_options_ holds it.
  const std::shared_ptr<std::atomic<bool>> give_up_ = std::make_shared<std::atomic<bool>>(false);
  const PeerLinkOptions link_options_;
  const std::shared_ptr<StagingPool> staging_;
  grpc::ClientContext context_;
  Mutex fetch_mu_;  // one fetch at a time: the link's transfers match PeerGets in order
  std::atomic<int> in_flight_{0};
  // The receive buffer taken for a fetch, grown when the server says a chunk was larger (a
  // 512-token chunk of an 8B model is 64 MiB).
  std::atomic<uint64_t> payload_hint_{64ull << 20};
  mutable Mutex mu_;
  CondVar changed_;
  State state_ ABSL_GUARDED_BY(mu_) = State::kOpening;
  absl::Status ended_ ABSL_GUARDED_BY(mu_);
  uint64_t id_ ABSL_GUARDED_BY(mu_) = 0;
  std::shared_ptr<PeerLink> link_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace lazykv
