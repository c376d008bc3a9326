// The "nccl" kind of peer_link.h (see nccl_peer_link.h for the shape).
//
// Every NCCL call on the link's communicator is made non-blocking (config.blocking = 0), so
// no call waits on the peer; the waiting happens here, in polls of ncclCommGetAsyncError and
// cudaEventQuery that look at the deadline and at Abort between polls. A transfer that
// fails in any way ends in ncclCommAbort, which makes NCCL's kernels that wait for a peer
// (one that died, or never posts the matching call) give up, and frees the communicator;
// the failed call then waits (bounded) for the link's stream to drain before it returns or
// runs `done`, so that no kernel touches a piece once its owner has it back.
//
// Locks (never nested, and neither is held while a `done` runs):
//   mu_       the send queue, the issuing turn and why the link died; the sender thread
//             sleeps on it.
//   comm_mu_  the communicator handle. Held for each single NCCL call (none blocks: the
//             communicator is non-blocking, and ncclGroupEnd only starts the launch) and
//             across ncclCommAbort, which nulls the handle. An abort so waits at most for one
//             short call, and every poll re-reads the handle under it: once null, the
//             transfer fails without touching the freed communicator. NCCL can only cut a
//             kernel short inside ncclCommAbort, so a poll that sees its event complete and
//             then the handle still set knows the transfer really completed.
// NCCL also requires that once a call answers ncclInProgress, nothing but
// ncclCommGetAsyncError or ncclCommAbort is called on the communicator until the state
// leaves ncclInProgress: the issuing turn (issuing_, under mu_) gives one thread at a time
// the span from ncclGroupStart to that point.
//
// Calls that reach CUDA here (Connect, Recv, Abort, the destructor) leave the calling
// thread's current device at the link's device, as ncclCommAbort does on its own; restoring
// the previous one could create a context on a GPU the process never meant to use.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/mutex.h"
#include "common/peer_link/nccl_library.h"
#include "common/peer_link/nccl_peer_link.h"
#include "common/peer_link/poll_backoff.h"
#include "spdlog/spdlog.h"

namespace lazykv {
namespace {

using Clock = PeerLinkClock;

absl::Status NcclError(const NcclApi& nccl, const char* call, ncclResult_t result) {
  const std::string text = absl::StrCat("nccl peer link: ", nccl.Describe(call, result));
  // ncclRemoteError: the peer (or the network to it) went away.
  return result == ncclRemoteError ? absl::AbortedError(text) : absl::InternalError(text);
}

absl::Status CudaError(const char* call, cudaError_t error) {
  return absl::InternalError(absl::StrCat("nccl peer link: ", call, ": ", cudaGetErrorString(error)));
}

class NcclPeerLink final : public PeerLink {
 public:
  NcclPeerLink(const NcclApi* nccl, int device, int rank, ncclComm_t comm, cudaStream_t stream, cudaEvent_t sent,
               cudaEvent_t received)
      : nccl_(nccl),
        device_(device),
        peer_(1 - rank),
        stream_(stream),
        sent_(sent),
        received_(received),
        comm_(comm),
        sender_([this] { SendLoop(); }) {}

  // Aborts rather than finalizing: ncclCommAbort never waits for the peer, and bytes the
  // peer has not finished reading stay valid (in one process NCCL frees the buffers only
  // when the last rank goes; across processes the peer's mapping keeps them).
  // REQUIRES: not called from a `done` (the sender thread cannot join itself).
  ~NcclPeerLink() override {
    Kill(absl::AbortedError("the link was destroyed"));
    sender_.join();  // fails whatever was still queued
    for (const Staging& s : staging_) {
      if (s.data != nullptr) cudaFreeAsync(s.data, stream_);
    }
    cudaStreamSynchronize(stream_);
    cudaEventDestroy(sent_);
    cudaEventDestroy(received_);
    cudaStreamDestroy(stream_);
  }

  void Send(std::vector<std::string_view> pieces, Clock::time_point deadline,
            std::function<void(absl::Status)> done) override {
    {
      MutexLock lock(&mu_);
      if (!dead_.load()) {
        std::vector<Piece> device_pieces;
        device_pieces.reserve(pieces.size());
        for (std::string_view p : pieces) device_pieces.push_back({const_cast<char*>(p.data()), p.size()});
        queue_.push_back(Job{std::move(device_pieces), deadline, std::move(done)});
        work_.Signal();
        return;
      }
    }
    done(DeadStatus());
  }

  absl::Status Recv(std::vector<std::span<char>> pieces, Clock::time_point deadline) override {
    if (dead_.load()) return DeadStatus();
    if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) {
      absl::Status status = CudaError("cudaSetDevice", e);
      Kill(status);
      return status;
    }
    std::vector<Piece> device_pieces;
    device_pieces.reserve(pieces.size());
    for (std::span<char> p : pieces) device_pieces.push_back({p.data(), p.size()});
    absl::Status status = Transfer(/*send=*/false, device_pieces, deadline, received_);
    if (!status.ok()) {
      Kill(status);
      DrainStream();
    }
    return status;
  }

  bool alive() const override { return !dead_.load(); }

  void Abort() override { Kill(absl::AbortedError("Abort() was called")); }

  // One transfer of kWarmUpBytes from rank 0 to rank 1 through the links' own buffers: NCCL
  // connects a pair of ranks at their first send, and that first transfer took hundreds of
  // milliseconds; paid here, at the join, rather than by the first chunk a worker waits for.
  absl::Status WarmUp(Clock::time_point deadline) {
    constexpr size_t kWarmUpBytes = 8 << 20;
    const bool send = peer_ == 1;
    // No other caller has the link yet, so nothing else touches the buffers.
    absl::StatusOr<char*> buffer = StagingFor(send, kWarmUpBytes);
    if (!buffer.ok()) return buffer.status();
    absl::Status status = Transfer(send, {Piece{*buffer, kWarmUpBytes}}, deadline, send ? sent_ : received_);
    if (!status.ok()) {
      Kill(status);
      DrainStream();
    }
    return status;
  }

  std::string_view kind() const override { return "nccl"; }

 private:
  struct Piece {
    void* data;
    size_t size;
  };
  struct Job {
    std::vector<Piece> pieces;
    Clock::time_point deadline;
    std::function<void(absl::Status)> done;
  };

  // Marks the link dead (keeping the first reason), wakes every waiter, aborts the
  // communicator. Idempotent; returns once the communicator is gone.
  void Kill(const absl::Status& why) {
    {
      MutexLock lock(&mu_);
      if (!dead_.load()) {
        death_ = why;
        dead_.store(true);
      }
      work_.SignalAll();
      turn_.SignalAll();
    }
    MutexLock lock(&comm_mu_);
    if (comm_ == nullptr) return;
    (void)cudaSetDevice(device_);
    const ncclResult_t result = nccl_->CommAbort(comm_);
    comm_ = nullptr;
    if (result != ncclSuccess) spdlog::warn("nccl peer link: {}", nccl_->Describe("ncclCommAbort", result));
  }

  // After Kill: waits until the kernels on the link's stream have ended (the abort makes
  // them quit within microseconds; ncclCommAbort itself may return before they do), so that
  // none reads or writes a piece after its owner takes it back. Bounded: a stream that does
  // not drain is logged, not waited on forever.
  void DrainStream() {
    const auto until = Clock::now() + std::chrono::seconds(5);
    PollBackoff backoff;
    while (cudaStreamQuery(stream_) == cudaErrorNotReady) {
      if (Clock::now() >= until) {
        spdlog::error(
            "nccl peer link: NCCL's kernels did not end within 5 s of the abort; the pieces may still be in use");
        return;
      }
      backoff.Pause();
    }
  }

  absl::Status DeadStatus() {
    MutexLock lock(&mu_);
    return absl::AbortedError(absl::StrCat("nccl peer link is dead: ", std::string(death_.message())));
  }

  // One look at the communicator: ncclSuccess, ncclInProgress or an NCCL error; nullopt once
  // it has been aborted.
  std::optional<ncclResult_t> CommState() {
    MutexLock lock(&comm_mu_);
    if (comm_ == nullptr) return std::nullopt;
    ncclResult_t state = ncclSuccess;
    const ncclResult_t result = nccl_->CommGetAsyncError(comm_, &state);
    return result != ncclSuccess ? result : state;
  }

  // One transfer, start to end, on the calling thread; any error leaves the caller to Kill.
  absl::Status Transfer(bool send, const std::vector<Piece>& pieces, Clock::time_point deadline, cudaEvent_t event) {
    absl::Status status = Start(send, pieces, deadline, event);
    if (!status.ok()) return status;
    return WaitFor(event, deadline, send ? "send" : "recv");
  }

  // A transfer put on the stream with `event` behind it, not waited for; any error leaves the
  // caller to Kill.
  absl::Status Start(bool send, const std::vector<Piece>& pieces, Clock::time_point deadline, cudaEvent_t event) {
    const char* what = send ? "send" : "recv";
    if (Clock::now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("nccl peer link: the ", what, "'s deadline passed before it began"));
    }
    {
      MutexLock lock(&mu_);
      while (issuing_ && !dead_.load()) {
        if (!turn_.WaitUntil(&mu_, deadline) && issuing_ && !dead_.load()) {
          return absl::DeadlineExceededError(
              absl::StrCat("nccl peer link: the ", what, " passed its deadline waiting for its turn to start"));
        }
      }
      if (dead_.load()) {
        lock.Unlock();
        return DeadStatus();
      }
      issuing_ = true;
    }
    absl::Status status = Issue(send, pieces, deadline, event);
    {
      MutexLock lock(&mu_);
      issuing_ = false;
      turn_.SignalAll();
    }
    return status;
  }

  // A transfer of several pieces goes as one NCCL call through a buffer of the link's own:
  // NCCL pays about 10 us for each send it pairs with a receive, so 32 pages of 2 MiB sent as
  // 32 calls ran at a third of one call's rate (H200 pair), while the gather (or scatter) is
  // a device copy at several times the link's rate. The buffer of a direction is reused by
  // the next transfer, which the stream orders after this one.
  // REQUIRES: the issuing turn (the buffers are touched only under it).
  absl::StatusOr<char*> StagingFor(bool send, size_t bytes) {
    Staging& s = staging_[send ? 0 : 1];
    if (s.bytes >= bytes) return s.data;
    // Stream-ordered: the old buffer goes after the transfers on the stream that use it, and
    // neither call waits for the device (cudaFree would wait for every kernel on it, other
    // links' sends among them).
    if (s.data != nullptr) {
      cudaFreeAsync(s.data, stream_);
      s = Staging{};
    }
    void* data = nullptr;
    if (cudaError_t e = cudaMallocAsync(&data, bytes, stream_); e != cudaSuccess) {
      (void)cudaGetLastError();
      return CudaError("cudaMalloc (the link's gather buffer)", e);
    }
    s = Staging{static_cast<char*>(data), bytes};
    return s.data;
  }

  // Puts the group of sends or receives on the stream, then the event behind it; several
  // pieces are gathered before a send, or scattered after a receive, through StagingFor.
  // REQUIRES: the issuing turn.
  absl::Status Issue(bool send, const std::vector<Piece>& all_pieces, Clock::time_point deadline,
                     cudaEvent_t event) {
    const char* what = send ? "send" : "recv";
    std::vector<Piece> pieces;
    size_t total = 0;
    for (const Piece& piece : all_pieces) {
      if (piece.size == 0) continue;
      pieces.push_back(piece);
      total += piece.size;
    }
    char* staging = nullptr;
    if (pieces.size() > 1) {
      absl::StatusOr<char*> buffer = StagingFor(send, total);
      if (!buffer.ok()) return buffer.status();
      staging = *buffer;
      if (send) {
        size_t at = 0;
        for (const Piece& piece : pieces) {
          if (cudaError_t e = cudaMemcpyAsync(staging + at, piece.data, piece.size, cudaMemcpyDeviceToDevice, stream_);
              e != cudaSuccess) {
            return CudaError("cudaMemcpyAsync (gathering a send)", e);
          }
          at += piece.size;
        }
      }
      pieces = {Piece{staging, total}};
    }
    {
      MutexLock lock(&comm_mu_);
      if (comm_ == nullptr) {
        lock.Unlock();
        return DeadStatus();
      }
      ncclResult_t result = nccl_->GroupStart();
      if (result != ncclSuccess) return NcclError(*nccl_, "ncclGroupStart", result);
      ncclResult_t failed = ncclSuccess;
      for (const Piece& piece : pieces) {
        if (piece.size == 0) continue;  // both sides skip it: the calls still pair up in order
        result = send ? nccl_->Send(piece.data, piece.size, ncclUint8, peer_, comm_, stream_)
                      : nccl_->Recv(piece.data, piece.size, ncclUint8, peer_, comm_, stream_);
        if (result != ncclSuccess && result != ncclInProgress) {
          failed = result;
          break;
        }
      }
      result = nccl_->GroupEnd();  // even after a failed call: it closes this thread's group
      if (failed != ncclSuccess) return NcclError(*nccl_, send ? "ncclSend" : "ncclRecv", failed);
      if (result != ncclSuccess && result != ncclInProgress) return NcclError(*nccl_, "ncclGroupEnd", result);
    }
    // Non-blocking, ncclGroupEnd may answer before the kernels are on the stream (the first
    // transfer also connects to the peer, which waits for the peer's matching call).
    PollBackoff backoff;
    while (true) {
      const std::optional<ncclResult_t> state = CommState();
      if (!state.has_value()) return DeadStatus();
      if (*state == ncclSuccess) break;
      if (*state != ncclInProgress) return NcclError(*nccl_, "ncclGroupEnd (asynchronous)", *state);
      if (Clock::now() >= deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("nccl peer link: the ", what, " passed its deadline before NCCL launched it"));
      }
      backoff.Pause();
    }
    if (staging != nullptr && !send) {  // behind the receive on the stream
      size_t at = 0;
      for (const Piece& piece : all_pieces) {
        if (piece.size == 0) continue;
        if (cudaError_t e = cudaMemcpyAsync(piece.data, staging + at, piece.size, cudaMemcpyDeviceToDevice, stream_);
            e != cudaSuccess) {
          return CudaError("cudaMemcpyAsync (scattering a receive)", e);
        }
        at += piece.size;
      }
    }
    if (cudaError_t e = cudaEventRecord(event, stream_); e != cudaSuccess) return CudaError("cudaEventRecord", e);
    return absl::OkStatus();
  }

  // Waits until the transfer behind `event` is done, NCCL reports an error, the link is
  // aborted or the deadline passes.
  absl::Status WaitFor(cudaEvent_t event, Clock::time_point deadline, const char* what) {
    PollBackoff backoff;
    while (true) {
      const cudaError_t query = cudaEventQuery(event);
      if (query != cudaSuccess && query != cudaErrorNotReady) return CudaError("cudaEventQuery", query);
      // After the query: a kernel that an abort cut short is seen here as aborted.
      const std::optional<ncclResult_t> state = CommState();
      if (!state.has_value()) return DeadStatus();
      // ncclInProgress: another thread's group is launching; not an error of this transfer.
      if (*state != ncclSuccess && *state != ncclInProgress) return NcclError(*nccl_, "NCCL (asynchronous)", *state);
      if (query == cudaSuccess) return absl::OkStatus();
      if (Clock::now() >= deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("nccl peer link: the ", what, " passed its deadline (the peer did not match it in time)"));
      }
      backoff.Pause();
    }
  }

  // Sends run ahead: up to kSendsInFlight are on the stream at once, each with its own
  // event, and complete in order. A send launched only once the one before it had ended
  // left NCCL's launch (a thread per group on a non-blocking communicator, tens of
  // microseconds) between every two transfers: 263 GB/s for 64 MiB chunks against 345 for
  // the same calls issued ahead (H200 pair). The gather buffer is safe to reuse: the stream
  // runs a gather only after the send before it.
  static constexpr size_t kSendsInFlight = 4;
  struct InFlight {
    Job job;
    cudaEvent_t event;
  };

  void SendLoop() {
    (void)cudaSetDevice(device_);  // for the event records; NCCL sets its own
    std::deque<InFlight> in_flight;
    std::vector<cudaEvent_t> spare = {sent_};
    // Ends every transfer on the stream with `why` (the first) or the link's death.
    auto fail_all = [&](absl::Status why) {
      Kill(why);
      DrainStream();
      for (InFlight& f : in_flight) {
        spare.push_back(f.event);
        f.job.done(why.ok() ? DeadStatus() : why);
        why = DeadStatus();
      }
      in_flight.clear();
    };
    PollBackoff backoff;
    while (true) {
      std::optional<Job> next;
      {
        MutexLock lock(&mu_);
        if (in_flight.empty()) {
          while (queue_.empty() && !dead_.load()) work_.Wait(&mu_);
          if (queue_.empty()) break;  // dead, nothing left to fail
        }
        if (!queue_.empty() && (in_flight.size() < kSendsInFlight || dead_.load())) {
          next = std::move(queue_.front());
          queue_.pop_front();
        }
      }
      if (next.has_value()) {
        if (dead_.load()) {
          if (!in_flight.empty()) fail_all(DeadStatus());
          next->done(DeadStatus());
          continue;
        }
        cudaEvent_t event = nullptr;
        if (!spare.empty()) {
          event = spare.back();
          spare.pop_back();
        } else if (cudaError_t e = cudaEventCreateWithFlags(&event, cudaEventDisableTiming); e != cudaSuccess) {
          absl::Status status = CudaError("cudaEventCreate", e);
          fail_all(status);
          next->done(status);
          continue;
        }
        absl::Status status = Start(/*send=*/true, next->pieces, next->deadline, event);
        if (!status.ok()) {
          spare.push_back(event);
          fail_all(status);
          next->done(status);
          continue;
        }
        in_flight.push_back(InFlight{*std::move(next), event});
        backoff = PollBackoff();
        continue;  // launch more before waiting
      }
      // Nothing to launch now: look at the oldest transfer.
      InFlight& oldest = in_flight.front();
      absl::StatusOr<bool> ended = Ended(oldest.event, oldest.job.deadline, "send");
      if (!ended.ok()) {
        fail_all(ended.status());
        continue;
      }
      if (*ended) {
        spare.push_back(oldest.event);
        Job job = std::move(oldest.job);
        in_flight.pop_front();
        job.done(absl::OkStatus());
        backoff = PollBackoff();
        continue;
      }
      backoff.Pause();
    }
    for (cudaEvent_t event : spare) {
      if (event != sent_) cudaEventDestroy(event);  // sent_ goes with the link
    }
  }

  // One look at the transfer behind `event`: true once it has ended, false while it runs; an
  // error for an NCCL error, an abort or a passed deadline.
  absl::StatusOr<bool> Ended(cudaEvent_t event, Clock::time_point deadline, const char* what) {
    const cudaError_t query = cudaEventQuery(event);
    if (query != cudaSuccess && query != cudaErrorNotReady) return CudaError("cudaEventQuery", query);
    const std::optional<ncclResult_t> state = CommState();  // after the query, as in WaitFor
    if (!state.has_value()) return DeadStatus();
    if (*state != ncclSuccess && *state != ncclInProgress) return NcclError(*nccl_, "NCCL (asynchronous)", *state);
    if (query == cudaSuccess) return true;
    if (Clock::now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("nccl peer link: the ", what, " passed its deadline (the peer did not match it in time)"));
    }
    return false;
  }

  const NcclApi* const nccl_;
  const int device_;
  const int peer_;
  const cudaStream_t stream_;   // the link's own; both directions use it, in issue order
  const cudaEvent_t sent_;      // the sender thread's
  const cudaEvent_t received_;  // Recv's (one caller at a time)

  std::atomic<bool> dead_{false};  // written under mu_; read anywhere
  Mutex mu_;
  CondVar work_;  // the queue grew, or the link died
  CondVar turn_;  // the issuing turn is free, or the link died
  std::deque<Job> queue_ ABSL_GUARDED_BY(mu_);
  bool issuing_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status death_ ABSL_GUARDED_BY(mu_);

  Mutex comm_mu_;
  ncclComm_t comm_ ABSL_GUARDED_BY(comm_mu_);  // null once aborted

  struct Staging {
    char* data = nullptr;
    size_t bytes = 0;
  };
  Staging staging_[2];  // gather (send) and scatter (receive) buffers; under the issuing turn

  std::thread sender_;  // last: started once the rest is built
};

}  // namespace

absl::Status NcclPeerLinkAvailable() {
  absl::StatusOr<const NcclApi*> nccl = Nccl();
  if (!nccl.ok()) return nccl.status();
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return absl::FailedPreconditionError(
        absl::StrCat("no CUDA device for NCCL: cudaGetDeviceCount: ", cudaGetErrorString(e)));
  }
  if (count < 1) return absl::FailedPreconditionError("no CUDA device for NCCL");
  return absl::OkStatus();
}

absl::StatusOr<std::string> NewNcclPeerLinkId() {
  absl::StatusOr<const NcclApi*> nccl = Nccl();
  if (!nccl.ok()) return nccl.status();
  ncclUniqueId id;
  // Also starts NCCL's bootstrap root (a thread and a socket in this process) that the two
  // ranks meet at.
  if (ncclResult_t r = (*nccl)->GetUniqueId(&id); r != ncclSuccess) return NcclError(**nccl, "ncclGetUniqueId", r);
  return std::string(id.internal, sizeof(id.internal));
}

absl::StatusOr<std::unique_ptr<PeerLink>> ConnectNcclPeerLink(int device, std::string_view id, int rank,
                                                              PeerLinkClock::time_point deadline,
                                                              const std::atomic<bool>* cancel) {
  if (rank != 0 && rank != 1)
    return absl::InvalidArgumentError(absl::StrCat("nccl peer link rank ", rank, " is not 0 or 1"));
  if (id.size() != sizeof(ncclUniqueId)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("malformed nccl peer link id: %d bytes, not %d", id.size(), sizeof(ncclUniqueId)));
  }
  absl::StatusOr<const NcclApi*> loaded = Nccl();
  if (!loaded.ok()) return loaded.status();
  const NcclApi& nccl = **loaded;
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
    (void)cudaGetLastError();
    return absl::FailedPreconditionError(
        absl::StrFormat("nccl peer link: cudaSetDevice(%d): %s", device, cudaGetErrorString(e)));
  }
  ncclUniqueId unique_id;
  std::memcpy(unique_id.internal, id.data(), sizeof(unique_id.internal));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every wait below has a deadline; see the top of this file
  ncclComm_t comm = nullptr;
  ncclResult_t result = nccl.CommInitRankConfig(&comm, /*nranks=*/2, unique_id, rank, &config);
  const std::string where = absl::StrFormat("(rank %d on GPU %d)", rank, device);
  auto give_up = [&](absl::Status status) {
    if (comm != nullptr) (void)nccl.CommAbort(comm);  // also ends NCCL's join, if still waiting
    return status;
  };
  if (result != ncclSuccess && result != ncclInProgress) {
    return give_up(NcclError(nccl, absl::StrCat("ncclCommInitRankConfig ", where).c_str(), result));
  }
  PollBackoff backoff;
  while (true) {
    ncclResult_t state = ncclInProgress;
    result = nccl.CommGetAsyncError(comm, &state);
    if (result != ncclSuccess) state = result;
    if (state == ncclSuccess) break;
    if (state != ncclInProgress) {
      return give_up(NcclError(nccl, absl::StrCat("ncclCommInitRankConfig ", where).c_str(), state));
    }
    if (Clock::now() >= deadline) {
      return give_up(
          absl::DeadlineExceededError(absl::StrCat("nccl peer link: the peer did not join in time ", where)));
    }
    if (cancel != nullptr && cancel->load()) {
      return give_up(absl::CancelledError(absl::StrCat("nccl peer link: the join was given up ", where)));
    }
    backoff.Pause();
  }
  cudaStream_t stream = nullptr;
  cudaEvent_t sent = nullptr, received = nullptr;
  cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&sent, cudaEventDisableTiming);
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&received, cudaEventDisableTiming);
  if (e != cudaSuccess) {
    if (received != nullptr) cudaEventDestroy(received);
    if (sent != nullptr) cudaEventDestroy(sent);
    if (stream != nullptr) cudaStreamDestroy(stream);
    return give_up(CudaError("creating the link's stream and events", e));
  }
  auto link = std::make_unique<NcclPeerLink>(&nccl, device, rank, comm, stream, sent, received);
  if (absl::Status warm = link->WarmUp(deadline); !warm.ok()) return warm;
  spdlog::debug("nccl peer link joined {} (NCCL {})", where, nccl.version);
  return std::unique_ptr<PeerLink>(std::move(link));
}

}  // namespace lazykv
