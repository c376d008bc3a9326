// A worker's same-host session with one cache server (DESIGN.md section 5): the
// ShmSession stream it holds open, the server's host arena mapped read-only
// (shm_arena_mapping.h), and the read leases it holds. A chunk fetched over it is handed
// out as pieces of the mapping (no copy) whose owner releases the lease when the last
// copy of those bytes goes; the release is queued and sent on the stream by the
// session's own thread, so no caller ever waits on the network for it. When the session
// ends (this object goes, the worker exits or is killed), the server drops every lease
// taken under it.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "common/chunk_bytes.h"
#include "common/mutex.h"
#include "proto/kvcache.grpc.pb.h"
#include "worker/tier/cuda_ipc_mapping.h"
#include "worker/tier/shm_arena_mapping.h"

namespace lazykv {

// Thread-safe: Adopt and Release may be called from any thread. Kept alive by the chunk
// bytes it handed out, so it may outlive whoever opened it.
class ShmClientSession : public std::enable_shared_from_this<ShmClientSession> {
 public:
  // Opens a session on `channel` (the server's answer within `deadline`) and maps the
  // arena. FAILED_PRECONDITION when the server has no shared arena or it cannot be mapped
  // from here (another host: use gRPC); DEADLINE_EXCEEDED or the call's error otherwise.
  // `pinner` (may be null) page-locks the mapping (shm_arena_mapping.h). With `gpu_device`
  // >= 0 and a server with a GPU tier on a GPU this device can reach, the tier's device
  // memory is opened too (cuda_ipc_mapping.h; a GPU tier that cannot be opened leaves the
  // session without it, logged).
  static absl::StatusOr<std::shared_ptr<ShmClientSession>> Open(std::shared_ptr<grpc::Channel> channel,
                                                                const std::string& holder,
                                                                std::chrono::microseconds deadline,
                                                                const HostPinner* pinner = nullptr,
                                                                int gpu_device = -1);
  // Sends what is queued and closes the stream (at most ~200 ms; then cancels it): the server
  // drops what is still leased, or holds it while this process lives (orphaned).
  ~ShmClientSession();
  ShmClientSession(const ShmClientSession&) = delete;
  ShmClientSession& operator=(const ShmClientSession&) = delete;

  uint64_t id() const { return id_; }
  const ShmArenaMapping& mapping() const { return *mapping_; }
  // The server's GPU tier, opened (null: none, or not reachable from this worker's GPU).
  const CudaIpcMapping* gpu() const { return gpu_.get(); }
  // False once sending on the stream failed (the server went away or restarted).
  bool alive() const;
  uint64_t leases_held() const;

  // The chunk that `answer` leases, as pieces of the mapping; the lease is released when
  // the last copy of the returned bytes goes. INVALID_ARGUMENT for an answer that does
  // not fit the arena (the lease is released at once).
  absl::StatusOr<ChunkBytes> Adopt(const v1::ShmGetResponse& answer);
  // The same for an answer from the GPU tier (tier TIER_GPU): the header from the answer,
  // in host memory, then the payload as device pointers into the opened GPU tier
  // (ChunkBytes::WithDeviceTail). FAILED_PRECONDITION without an opened GPU tier.
  absl::StatusOr<ChunkBytes> AdoptGpu(const v1::ShmGetResponse& answer);
  // Queues the lease's release (sent by the session's thread).
  void Release(uint64_t lease_id);
  // Queues the drop of a reservation that will not be committed (sent likewise).
  void Abandon(uint64_t reservation_id);
  // Queues the release of whatever a lookup leased under `lookup_id` (LookupRequest) whose
  // answer this worker did not get or could not use (sent likewise).
  void ReleaseLookup(uint64_t lookup_id);

 private:
  ShmClientSession() = default;
  // Opens the stream and waits for the server's answer; then sends queued releases
  // until stopped or a write fails.
  void Run(std::string holder);

  std::unique_ptr<v1::KvCache::Stub> stub_;
  grpc::ClientContext context_;
  // Written by the session's thread only; read by the destructor after joining it.
  std::unique_ptr<grpc::ClientReaderWriter<v1::ShmSessionRequest, v1::ShmSessionResponse>> stream_;
  bool finished_ = false;  // Finish was called
  uint64_t id_ = 0;
  std::shared_ptr<const ShmArenaMapping> mapping_;
  std::shared_ptr<const CudaIpcMapping> gpu_;

  mutable Mutex mu_;
  CondVar changed_;                           // opened, releases queued, or stopping
  bool opened_ ABSL_GUARDED_BY(mu_) = false;  // the answer arrived, or the stream failed
  v1::ShmSessionResponse answer_ ABSL_GUARDED_BY(mu_);
  grpc::Status open_status_ ABSL_GUARDED_BY(mu_);
  bool alive_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<uint64_t> pending_ ABSL_GUARDED_BY(mu_);       // releases not yet sent
  std::vector<uint64_t> abandoned_ ABSL_GUARDED_BY(mu_);     // abandoned reservations not yet sent
  std::vector<uint64_t> lost_lookups_ ABSL_GUARDED_BY(mu_);  // lookups whose leases to release, not yet sent
  bool flushed_ ABSL_GUARDED_BY(mu_) = false;  // stopping: the thread sent what was queued and closed the stream
  uint64_t held_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace lazykv
