#include "worker/tier/peer_link_session.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include "absl/strings/str_format.h"
#include "common/chunk_codec.h"
#include "common/grpc_util.h"

namespace lazykv {
namespace {

using Clock = PeerLinkClock;
constexpr int kMaxSegments = 1 << 16;

// What a fetched chunk's bytes hold: the staging buffer with its payload, and its header.
struct ReceivedChunk {
  std::shared_ptr<StagingBuffer> buffer;
  std::string header;
};

}  // namespace

std::shared_ptr<PeerLinkClientSession> PeerLinkClientSession::Start(std::shared_ptr<grpc::Channel> channel,
                                                                    std::string holder, PeerLinkOptions link,
                                                                    std::shared_ptr<StagingPool> staging,
                                                                    std::chrono::milliseconds answer_timeout,
                                                                    uint64_t buffer_bytes) {
  std::shared_ptr<PeerLinkClientSession> session(new PeerLinkClientSession(std::move(link), std::move(staging)));
  session->payload_hint_.store(buffer_bytes);
  session->thread_ = std::thread([s = session.get(), channel = std::move(channel), holder = std::move(holder),
                                  answer_timeout] { s->Run(channel, holder, answer_timeout); });
  return session;
}

PeerLinkClientSession::~PeerLinkClientSession() {
  End(absl::CancelledError("peer link session closed"));
  if (thread_.joinable()) thread_.join();
}

void PeerLinkClientSession::Run(std::shared_ptr<grpc::Channel> channel, std::string holder,
                                std::chrono::milliseconds answer_timeout) {
  std::unique_ptr<v1::KvCache::Stub> stub = v1::KvCache::NewStub(channel);
  auto stream = stub->PeerLinkSession(&context_);
  v1::PeerLinkSessionRequest request;
  request.set_holder(holder);
  request.set_kind(link_options_.kind);
  v1::PeerLinkSessionResponse answer;
  // The answer must come in time: a timer thread cancels the stream otherwise (the stream
  // itself has no deadline, it lives as long as the session).
  bool replied = false;  // the server answered or refused (under mu_)
  std::thread timer([this, answer_timeout, &replied] {
    MutexLock lock(&mu_);
    const auto deadline = Clock::now() + answer_timeout;
    while (state_ == State::kOpening && !replied && Clock::now() < deadline) changed_.WaitUntil(&mu_, deadline);
    if (state_ == State::kOpening && !replied) context_.TryCancel();
  });
  const bool answered = stream->Write(request) && stream->Read(&answer);
  {
    MutexLock lock(&mu_);
    replied = true;
    if (answered) id_ = answer.session_id();
  }
  changed_.SignalAll();
  timer.join();
  if (!answered || answer.session_id() == 0) {
    grpc::Status finished = stream->Finish();
    End(finished.ok() ? absl::UnavailableError("the server did not answer the peer link session in time")
                      : FromGrpcStatus(finished));
    return;
  }
  auto link = ConnectPeerLink(link_options_, answer.link_id(), /*rank=*/1,
                              Clock::now() + std::chrono::milliseconds(answer.join_timeout_ms()));
  if (link.ok()) {
    MutexLock lock(&mu_);
    if (state_ == State::kOpening) {
      link_ = *std::move(link);
      state_ = State::kReady;
    }
  } else {
    End(link.status());
  }
  changed_.SignalAll();
  // Until the server ends the stream (it went away, restarted, or shut down) or End cancels it.
  v1::PeerLinkSessionResponse ignored;
  while (stream->Read(&ignored)) {
  }
  (void)stream->Finish();
  End(absl::UnavailableError("the cache server ended the peer link session"));
}

void PeerLinkClientSession::End(absl::Status why) {
  std::shared_ptr<PeerLink> link;
  {
    MutexLock lock(&mu_);
    if (state_ == State::kEnded) return;
    state_ = State::kEnded;
    ended_ = std::move(why);
    link = link_;
  }
  give_up_->store(true);  // a join under way ends within milliseconds
  changed_.SignalAll();
  context_.TryCancel();         // the server aborts its side when the stream ends
  if (link != nullptr) link->Abort();  // and a transfer waiting here ends now
}

PeerLinkClientSession::State PeerLinkClientSession::state() const {
  MutexLock lock(&mu_);
  return state_;
}

absl::Status PeerLinkClientSession::ended_status() const {
  MutexLock lock(&mu_);
  return ended_;
}

uint64_t PeerLinkClientSession::id() const {
  MutexLock lock(&mu_);
  return id_;
}

absl::StatusOr<ChunkBytes> PeerLinkClientSession::Fetch(const Hash128& key, const PeerGetCall& call,
                                                        Clock::time_point transfer_deadline, double* setup_seconds) {
  if (setup_seconds != nullptr) *setup_seconds = 0;
  in_flight_.fetch_add(1);
  struct Leave {
    std::atomic<int>& n;
    ~Leave() { n.fetch_sub(1); }
  } leave{in_flight_};
  MutexLock order(&fetch_mu_);
  v1::PeerGetRequest request;
  {
    MutexLock lock(&mu_);
    if (state_ != State::kReady) return absl::FailedPreconditionError("the peer link session is not ready");
    request.set_session_id(id_);
  }
  *request.mutable_key() = ToProto(key);
  // The buffer is taken before the call: once the server has queued the chunk, failing to
  // receive it would cost the link. The server sends nothing larger than it, and says how
  // large the chunk is instead: then once more with a buffer that fits.
  absl::StatusOr<std::shared_ptr<StagingBuffer>> buffer;
  v1::PeerGetResponse answer;
  for (int attempt = 0; attempt < 2; ++attempt) {
    buffer = staging_->Acquire(payload_hint_.load());
    if (!buffer.ok()) return buffer.status();  // nothing asked: the session lives on
    if (setup_seconds != nullptr) *setup_seconds += (*buffer)->allocation_seconds();
    request.set_max_payload_bytes((*buffer)->size());
    answer.Clear();
    absl::Status called = call(request, &answer);
    if (!called.ok()) {
      End(called);  // the server may have queued the chunk: the link is out of step
      return called;
    }
    if (answer.found() || answer.stored_bytes() <= kChunkHeaderBytes) break;
    uint64_t hint = payload_hint_.load();  // too large for the buffer: a larger one
    const uint64_t needed = answer.stored_bytes() - kChunkHeaderBytes;
    while (hint < needed && !payload_hint_.compare_exchange_weak(hint, needed)) {
    }
    buffer = absl::ResourceExhaustedError("larger than the peer link's receive buffer");
  }
  if (!answer.found()) {
    return answer.stored_bytes() > kChunkHeaderBytes ? buffer.status()
                                                     : absl::NotFoundError("not in the server's GPU tier");
  }
  absl::StatusOr<ChunkBytes> received = Receive(answer, *std::move(buffer), transfer_deadline);
  if (!received.ok()) End(received.status());
  return received;
}

absl::StatusOr<ChunkBytes> PeerLinkClientSession::Receive(const v1::PeerGetResponse& answer,
                                                          std::shared_ptr<StagingBuffer> buffer,
                                                          Clock::time_point deadline) {
  if (answer.header().size() != kChunkHeaderBytes || answer.stored_bytes() < kChunkHeaderBytes ||
      answer.stored_bytes() - kChunkHeaderBytes > buffer->size() || answer.segments_size() > kMaxSegments) {
    return absl::InternalError(absl::StrFormat(
        "PeerGet answer: malformed header (%d bytes), stored_bytes (%d, buffer %d) or segments (%d)",
        answer.header().size(), answer.stored_bytes(), buffer->size(), answer.segments_size()));
  }
  const uint64_t payload = answer.stored_bytes() - kChunkHeaderBytes;
  uint64_t total = 0;
  for (uint64_t segment : answer.segments()) {
    if (segment > payload - total) {  // checked before adding: a sum that wraps cannot pass
      return absl::InternalError(absl::StrFormat("PeerGet answer: segments exceed the payload of %d bytes", payload));
    }
    total += segment;
  }
  if (total != payload) {
    return absl::InternalError(
        absl::StrFormat("PeerGet answer: segments sum to %d bytes, the payload has %d", total, payload));
  }
  std::shared_ptr<PeerLink> link;
  {
    MutexLock lock(&mu_);
    link = link_;
  }
  if (link == nullptr) return absl::FailedPreconditionError("the peer link session has ended");
  char* at = buffer->data();
  for (uint64_t segment : answer.segments()) {  // one transfer each, in order
    if (absl::Status status = link->Recv({std::span<char>(at, segment)}, deadline); !status.ok()) return status;
    at += segment;
  }
  auto owner = std::make_shared<const ReceivedChunk>(ReceivedChunk{std::move(buffer), answer.header()});
  const std::string_view header = owner->header;
  const std::string_view body((*owner->buffer).data(), payload);
  if (link_options_.kind == "nccl") return ChunkBytes::WithDeviceTail({header}, {body}, owner);
  return ChunkBytes({header, body}, owner);
}

}  // namespace lazykv
