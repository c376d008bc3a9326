#include "worker/tier/shm_session.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include "absl/strings/str_format.h"
#include "common/chunk_codec.h"
#include "common/grpc_util.h"

namespace lazykv {
namespace {

// Keeps a leased chunk's bytes valid (the mapping) and releases the lease when the last
// copy of them goes.
struct LeasedBytes {
  std::shared_ptr<ShmClientSession> session;
  uint64_t lease_id = 0;
  std::string header;  // a GPU tier chunk's header, in host memory
  ~LeasedBytes() { session->Release(lease_id); }
};

}  // namespace

absl::StatusOr<std::shared_ptr<ShmClientSession>> ShmClientSession::Open(std::shared_ptr<grpc::Channel> channel,
                                                                         const std::string& holder,
                                                                         std::chrono::microseconds deadline,
                                                                         const HostPinner* pinner, int gpu_device) {
  std::shared_ptr<ShmClientSession> session(new ShmClientSession());
  session->stub_ = v1::KvCache::NewStub(channel);
  session->thread_ = std::thread([s = session.get(), holder] { s->Run(holder); });
  v1::ShmSessionResponse answer;
  {
    MutexLock lock(&session->mu_);
    const auto until = std::chrono::steady_clock::now() + deadline;
    while (!session->opened_) {
      if (!session->changed_.WaitUntil(&session->mu_, until)) break;
    }
    if (!session->opened_) {
      lock.Unlock();
      return absl::DeadlineExceededError(
          absl::StrFormat("shm session: no answer within %.1f ms", deadline.count() / 1000.0));
      // The destructor cancels the stream and joins the thread.
    }
    if (!session->open_status_.ok()) return FromGrpcStatus(session->open_status_);
    answer = session->answer_;
  }
  auto mapping = ShmArenaMapping::Map(ShmArenaIdentity{.server_pid = answer.server_pid(),
                                                       .arena_fd = answer.arena_fd(),
                                                       .arena_bytes = answer.arena_bytes(),
                                                       .page_bytes = answer.page_bytes(),
                                                       .dev = answer.arena_dev(),
                                                       .ino = answer.arena_ino(),
                                                       .boot_id = answer.boot_id()},
                                      pinner);
  if (!mapping.ok()) return mapping.status();
  session->mapping_ = *std::move(mapping);
  if (gpu_device >= 0 && !answer.gpu_ipc_handle().empty()) {
    auto gpu = CudaIpcMapping::Open(answer.gpu_ipc_handle(), answer.gpu_device_uuid(), gpu_device,
                                    answer.gpu_arena_bytes(), answer.gpu_page_bytes());
    if (gpu.ok()) {
      session->gpu_ = *std::move(gpu);
      spdlog::info("shm session {:016x}: the server's GPU tier ({} bytes) opened on GPU {}{}", answer.session_id(),
                   answer.gpu_arena_bytes(), gpu_device, session->gpu_->peer() ? " (peer access)" : "");
    } else {
      spdlog::info("shm session {:016x}: the server's GPU tier is not reachable ({}); its chunks come from host RAM",
                   answer.session_id(), gpu.status().ToString());
    }
  }
  session->id_ = answer.session_id();
  return session;
}

void ShmClientSession::Run(std::string holder) {
  stream_ = stub_->ShmSession(&context_);
  v1::ShmSessionRequest hello;
  hello.set_holder(std::move(holder));
  hello.set_holder_pid(static_cast<int32_t>(getpid()));  // the server holds our pages until we exit
  v1::ShmSessionResponse answer;
  const bool answered = stream_->Write(hello) && stream_->Read(&answer);
  {
    MutexLock lock(&mu_);
    opened_ = true;
    alive_ = answered;
    if (answered) {
      answer_ = answer;
    } else {
      lock.Unlock();
      const grpc::Status status = stream_->Finish();  // why the server ended it
      finished_ = true;
      lock.Lock();
      open_status_ = status.ok() ? grpc::Status(grpc::StatusCode::UNAVAILABLE, "shm session ended at once") : status;
    }
  }
  changed_.SignalAll();
  if (!answered) return;
  MutexLock lock(&mu_);
  while (true) {
    while (!stopping_ && pending_.empty() && abandoned_.empty() && lost_lookups_.empty()) changed_.Wait(&mu_);
    if (pending_.empty() && abandoned_.empty() && lost_lookups_.empty()) {
      // Stopping, everything sent: close our side so that the server reads the releases
      // before the stream ends (a cancel could overtake them), and wait for its end.
      lock.Unlock();
      stream_->WritesDone();
      (void)stream_->Finish();
      finished_ = true;
      lock.Lock();
      flushed_ = true;
      changed_.SignalAll();
      break;
    }
    v1::ShmSessionRequest release;
    for (uint64_t id : pending_) release.add_release(id);
    for (uint64_t id : abandoned_) release.add_abandon(id);
    for (uint64_t id : lost_lookups_) release.add_release_lookup(id);
    pending_.clear();
    abandoned_.clear();
    lost_lookups_.clear();
    lock.Unlock();
    const bool sent = stream_->Write(release);
    lock.Lock();
    if (!sent) {
      alive_ = false;  // the server is gone: its leases died with the stream
      pending_.clear();
      abandoned_.clear();
      lost_lookups_.clear();
      changed_.SignalAll();  // a destructor waiting for the flush need not
      while (!stopping_) changed_.Wait(&mu_);
      break;
    }
  }
}

ShmClientSession::~ShmClientSession() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    changed_.SignalAll();
    // The releases still queued go first (else the server would hold their leases as an
    // orphan's while this process lives); a hung server gets 200 ms.
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
    while (alive_ && !flushed_ && changed_.WaitUntil(&mu_, until)) {
    }
  }
  // Cancelling ends the stream on both sides at once (the server then drops or orphans any
  // lease still held).
  context_.TryCancel();
  if (thread_.joinable()) thread_.join();
  if (stream_ != nullptr && !finished_) (void)stream_->Finish();  // CANCELLED, at once
}

bool ShmClientSession::alive() const {
  MutexLock lock(&mu_);
  return alive_;
}

uint64_t ShmClientSession::leases_held() const {
  MutexLock lock(&mu_);
  return held_;
}

absl::StatusOr<ChunkBytes> ShmClientSession::Adopt(const v1::ShmGetResponse& answer) {
  {
    MutexLock lock(&mu_);
    ++held_;
  }
  // Built in place: a temporary LeasedBytes would release the lease as it goes.
  std::shared_ptr<const LeasedBytes> owner(new LeasedBytes{shared_from_this(), answer.lease_id(), {}});
  auto pieces =
      mapping_->Pieces(std::span<const uint32_t>(answer.pages().data(), answer.pages_size()), answer.stored_bytes());
  if (!pieces.ok()) return pieces.status();  // `owner` releases the lease
  return ChunkBytes(*std::move(pieces), std::move(owner));
}

absl::StatusOr<ChunkBytes> ShmClientSession::AdoptGpu(const v1::ShmGetResponse& answer) {
  {
    MutexLock lock(&mu_);
    ++held_;
  }
  std::shared_ptr<LeasedBytes> owner(new LeasedBytes{shared_from_this(), answer.lease_id(), answer.header()});
  if (gpu_ == nullptr) return absl::FailedPreconditionError("GPU tier answer on a session without the GPU tier");
  if (answer.header().size() != kChunkHeaderBytes || answer.stored_bytes() < kChunkHeaderBytes) {
    return absl::InvalidArgumentError("GPU tier answer: malformed header or size");
  }
  auto device = gpu_->Pieces(std::span<const uint32_t>(answer.pages().data(), answer.pages_size()), kChunkHeaderBytes,
                             answer.stored_bytes() - kChunkHeaderBytes);
  if (!device.ok()) return device.status();  // `owner` releases the lease
  const std::string_view header = owner->header;
  // The mapping stays open while the bytes live: the owner holds the session, which holds it.
  return ChunkBytes::WithDeviceTail({header}, *std::move(device), std::move(owner));
}

void ShmClientSession::Release(uint64_t lease_id) {
  {
    MutexLock lock(&mu_);
    --held_;
    if (!alive_) return;
    pending_.push_back(lease_id);
  }
  changed_.Signal();
}

void ShmClientSession::ReleaseLookup(uint64_t lookup_id) {
  {
    MutexLock lock(&mu_);
    if (!alive_) return;
    lost_lookups_.push_back(lookup_id);
  }
  changed_.Signal();
}

void ShmClientSession::Abandon(uint64_t reservation_id) {
  {
    MutexLock lock(&mu_);
    if (!alive_) return;
    abandoned_.push_back(reservation_id);
  }
  changed_.Signal();
}

}  // namespace lazykv
