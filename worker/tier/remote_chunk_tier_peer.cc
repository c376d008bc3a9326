// RemoteChunkTier's links across GPUs (DESIGN.md section 5): a chunk in a cache server's GPU
// tier that this worker's GPU cannot open through CUDA IPC (another host, a GPU this process
// does not see, or --transport nccl) comes over a point-to-point link (NCCL; its socket twin
// in tests) straight into a staging buffer on this worker's GPU.
#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include "absl/strings/str_format.h"
#include "common/grpc_util.h"
#include "worker/tier/remote_chunk_tier.h"
#include "worker/tier/remote_chunk_tier_run.h"

namespace lazykv {

bool RemoteChunkTier::WantsPeerLink(Server& server) {
  // An NCCL link receives into this worker's GPU: none without one (the CPU backend, or a
  // fleet that signs chunks, whose MACs are checked on the host).
  if (options_.peer_link_kind == "nccl" && options_.gpu_device < 0) return false;
  if (options_.transport == FetchTransport::kNccl) return true;
  if (options_.transport != FetchTransport::kAuto || options_.peer_link_kind != "nccl" || options_.gpu_device < 0) {
    return false;
  }
  // auto: CUDA IPC serves a server whose GPU tier this worker opened (no rendezvous, no
  // kernels on either GPU); a link serves the rest.
  std::shared_ptr<ShmClientSession> shm = ShmSessionFor(server);
  return shm == nullptr || shm->gpu() == nullptr;
}

std::shared_ptr<PeerLinkClientSession> RemoteChunkTier::PeerSessionFor(Server& server) {
  // Ended sessions are let go after the lock: their destruction aborts a communicator and
  // may wait for the device, which no other fetch to this server should wait behind.
  std::vector<std::shared_ptr<PeerLinkClientSession>> ended;
  MutexLock lock(&server.peer_mu);
  if (server.peers.empty()) server.peers.resize(static_cast<size_t>(std::max(1, options_.peer_links_per_server)));
  const auto now = std::chrono::steady_clock::now();
  std::shared_ptr<PeerLinkClientSession> best;
  for (Server::PeerSlot& slot : server.peers) {
    if (slot.session != nullptr) {
      switch (slot.session->state()) {
        case PeerLinkClientSession::State::kReady:
          if (best == nullptr || slot.session->in_flight() < best->in_flight()) best = slot.session;
          continue;
        case PeerLinkClientSession::State::kOpening:
          continue;
        case PeerLinkClientSession::State::kEnded:
          if (!server.peer_logged || options_.transport == FetchTransport::kNccl) {
            spdlog::info("cache server {}: peer link session ended ({}); its GPU tier's chunks come another way "
                         "(next try in {} ms)",
                         server.address, std::string(slot.session->ended_status().message()),
                         options_.shm_retry_interval.count());
          }
          server.peer_logged = true;
          // A refusal (no GPU tier, no NCCL there, a kind it cannot serve) will not change
          // soon: tried again after a minute rather than every few seconds.
          slot.next_try = now + (slot.session->ended_status().code() == absl::StatusCode::kFailedPrecondition
                                     ? std::chrono::milliseconds(60000)
                                     : options_.shm_retry_interval);
          ended.push_back(std::move(slot.session));
          continue;
      }
    }
    if (now < slot.next_try) continue;
    if (absl::Status available = PeerLinkAvailable(options_.peer_link_kind); !available.ok()) {
      if (!server.peer_logged) spdlog::info("peer links off: {}", std::string(available.message()));
      server.peer_logged = true;
      slot.next_try = std::chrono::steady_clock::time_point::max();  // it will not change
      continue;
    }
    slot.session = PeerLinkClientSession::Start(server.channel, options_.holder,
                                                PeerLinkOptions{.kind = options_.peer_link_kind, .device = std::max(options_.gpu_device, 0), .cancel = nullptr},
                                                peer_staging_, options_.peer_answer_timeout,
                                                options_.peer_first_buffer_bytes);
  }
  lock.Unlock();
  ended.clear();
  return best;
}

absl::StatusOr<FetchedChunk> RemoteChunkTier::FetchPeer(Server& server, const Hash128& key) {
  std::shared_ptr<PeerLinkClientSession> session = PeerSessionFor(server);
  if (session == nullptr) return absl::FailedPreconditionError("no peer link session ready");
  // PeerGet answers once the chunk is queued on the link: a small call's deadline, and no
  // retry (a second PeerGet would queue the chunk twice). The payload then arrives within a
  // transfer's deadline.
  auto call = [&](const v1::PeerGetRequest& request, v1::PeerGetResponse* response) -> absl::Status {
    const Attempted attempted = Run(server, CallDeadline(server), /*retries=*/0, "peer_get", [&](grpc::ClientContext& context) {
      return server.stub->PeerGet(&context, request, response);
    });
    if (attempted.status.ok()) {
      MutexLock lock(&server.mu);
      server.estimator.ObserveCall(attempted.elapsed);
    }
    return FromGrpcStatus(attempted.status);
  };
  const auto deadline = std::chrono::steady_clock::now() + TransferDeadline(server, 0);
  double setup_seconds = 0;
  absl::StatusOr<ChunkBytes> bytes = session->Fetch(key, call, deadline, &setup_seconds);  // may end the session
  if (!bytes.ok()) return bytes.status();
  nccl_chunks_.fetch_add(1);
  nccl_bytes_.fetch_add(bytes->size());
  // Verified as a CUDA IPC fetch is: the payload left the server's GPU tier, which took it
  // from host RAM or disk after their checks, and the link carried it unchanged.
  return FetchedChunk{*std::move(bytes), ChunkSource::kRemote, server.address, /*payload_verified=*/true,
                      setup_seconds};
}

}  // namespace lazykv
