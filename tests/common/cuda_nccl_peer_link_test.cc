// The "nccl" peer link on two real GPUs, both ranks in this process (GPU 0 sends, GPU 1
// receives): random bytes in pieces of odd sizes (an empty one, one over 16 MiB) arrive
// exactly, over several transfers queued back to back; a Recv or a Send whose peer never
// matches it ends at its deadline and kills the link; Abort ends a Recv that waits, and a
// dying sender fails every queued Send; a join the peer never makes ends at its deadline.
// Skips without NCCL or with fewer than two GPUs (NCCL refuses two ranks on one GPU).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/peer_link/peer_link.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace lazykv::testing {
namespace {

using Clock = PeerLinkClock;
using std::chrono::milliseconds;

const PeerLinkOptions kSender{.kind = "nccl", .device = 0, .cancel = nullptr};
const PeerLinkOptions kReceiver{.kind = "nccl", .device = 1, .cancel = nullptr};
constexpr milliseconds kShortDeadline{200};
constexpr milliseconds kMargin{1800};  // the deadline tests' bound: 200 ms + this < 2 s
// Larger than all of NCCL's staging buffers for one peer, so that a send of it cannot
// complete before the receiver posts its receive.
constexpr size_t kBigPiece = size_t{256} << 20;

double Seconds(Clock::time_point since) { return std::chrono::duration<double>(Clock::now() - since).count(); }

// Device memory on one GPU, freed at the end of its scope.
class DeviceBytes {
 public:
  DeviceBytes(int device, size_t size) : device_(device), size_(size) {
    cudaSetDevice(device);
    if (cudaMalloc(&data_, std::max<size_t>(size, 1)) != cudaSuccess) data_ = nullptr;
  }
  ~DeviceBytes() {
    cudaSetDevice(device_);
    cudaFree(data_);
  }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;

  char* data() const { return static_cast<char*>(data_); }
  size_t size() const { return size_; }
  bool ok() const { return data_ != nullptr; }
  std::string_view view() const { return {data(), size_}; }
  std::span<char> span() const { return {data(), size_}; }

  bool Upload(const std::string& host) {
    cudaSetDevice(device_);
    return cudaMemcpy(data_, host.data(), host.size(), cudaMemcpyHostToDevice) == cudaSuccess;
  }
  bool Fill(int byte) {
    cudaSetDevice(device_);
    return cudaMemset(data_, byte, size_) == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess;
  }
  std::string Download() const {
    std::string host(size_, '\0');
    cudaSetDevice(device_);
    if (cudaMemcpy(host.data(), data_, size_, cudaMemcpyDeviceToHost) != cudaSuccess) return "download failed";
    return host;
  }

 private:
  const int device_;
  const size_t size_;
  void* data_ = nullptr;
};

std::vector<std::unique_ptr<DeviceBytes>> Allocate(int device, const std::vector<size_t>& sizes) {
  std::vector<std::unique_ptr<DeviceBytes>> pieces;
  for (size_t size : sizes) {
    pieces.push_back(std::make_unique<DeviceBytes>(device, size));
    EXPECT_TRUE(pieces.back()->ok()) << "cudaMalloc of " << size << " bytes on GPU " << device;
  }
  return pieces;
}

std::vector<std::string_view> Views(const std::vector<std::unique_ptr<DeviceBytes>>& pieces) {
  std::vector<std::string_view> views;
  for (const auto& p : pieces) views.push_back(p->view());
  return views;
}

std::vector<std::span<char>> Spans(const std::vector<std::unique_ptr<DeviceBytes>>& pieces) {
  std::vector<std::span<char>> spans;
  for (const auto& p : pieces) spans.push_back(p->span());
  return spans;
}

std::string RandomBytes(std::mt19937_64& rng, size_t size) {
  std::string bytes(size, '\0');
  for (size_t i = 0; i < size; i += 8) {
    const uint64_t word = rng();
    std::memcpy(bytes.data() + i, &word, std::min<size_t>(8, size - i));
  }
  return bytes;
}

// A Send's outcome, for a test to wait on. The callback shares the promise, so a `done`
// that runs after the test gave up waiting touches nothing freed.
struct Outcome {
  std::shared_ptr<std::promise<absl::Status>> promise = std::make_shared<std::promise<absl::Status>>();
  std::future<absl::Status> future = promise->get_future();
  std::function<void(absl::Status)> Done() {
    return [promise = promise](absl::Status s) { promise->set_value(std::move(s)); };
  }
  // The status, or UNKNOWN when `done` did not run within `wait`.
  absl::Status Wait(milliseconds wait = milliseconds(10000)) {
    if (future.wait_for(wait) != std::future_status::ready) return absl::UnknownError("done did not run");
    return future.get();
  }
};

class CudaNcclPeerLinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (absl::Status s = PeerLinkAvailable("nccl"); !s.ok()) GTEST_SKIP() << s;
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count < 2) {
      GTEST_SKIP() << "needs two GPUs (NCCL refuses two ranks on one GPU); found " << count;
    }
  }

  // Both ends of a fresh link, joined from two threads.
  void Connect() {
    absl::StatusOr<std::string> id = NewPeerLinkId(kSender);
    ASSERT_TRUE(id.ok()) << id.status();
    const auto deadline = Clock::now() + std::chrono::seconds(60);
    absl::StatusOr<std::unique_ptr<PeerLink>> receiver;
    std::thread join([&] { receiver = ConnectPeerLink(kReceiver, *id, 1, deadline); });
    absl::StatusOr<std::unique_ptr<PeerLink>> sender = ConnectPeerLink(kSender, *id, 0, deadline);
    join.join();
    ASSERT_TRUE(sender.ok()) << sender.status();
    ASSERT_TRUE(receiver.ok()) << receiver.status();
    EXPECT_EQ((*sender)->kind(), "nccl");
    sender_ = *std::move(sender);
    receiver_ = *std::move(receiver);
  }

  // One transfer of `sizes` bytes that must arrive (a connected, warmed-up link).
  void TransferOnce(const std::vector<size_t>& sizes) {
    auto source = Allocate(0, sizes);
    auto target = Allocate(1, sizes);
    Outcome sent;
    sender_->Send(Views(source), Clock::now() + std::chrono::seconds(30), sent.Done());
    ASSERT_TRUE(receiver_->Recv(Spans(target), Clock::now() + std::chrono::seconds(30)).ok());
    ASSERT_TRUE(sent.Wait().ok());
  }

  void TearDown() override {
    receiver_.reset();
    sender_.reset();
  }

  std::unique_ptr<PeerLink> sender_;
  std::unique_ptr<PeerLink> receiver_;
};

TEST_F(CudaNcclPeerLinkTest, RandomPiecesOfOddSizesArriveExactly) {
  const uint64_t seed = FreshSeed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  ASSERT_NO_FATAL_FAILURE(Connect());
  const std::vector<size_t> sizes = {1, 0, 4097, (size_t{17} << 20) + 3, 65537, (size_t{3} << 20) - 1, 7};
  constexpr int kQueued = 3;
  for (int batch = 0; batch < 2; ++batch) {
    // kQueued transfers queued before the first receive: they go in order.
    std::vector<std::vector<std::unique_ptr<DeviceBytes>>> sources;
    std::vector<std::vector<std::string>> originals;
    std::vector<std::unique_ptr<Outcome>> sent;
    for (int t = 0; t < kQueued; ++t) {
      sources.push_back(Allocate(0, sizes));
      originals.emplace_back();
      for (size_t p = 0; p < sizes.size(); ++p) {
        originals.back().push_back(RandomBytes(rng, sizes[p]));
        ASSERT_TRUE(sources.back()[p]->Upload(originals.back()[p]));
      }
      sent.push_back(std::make_unique<Outcome>());
      sender_->Send(Views(sources.back()), Clock::now() + std::chrono::seconds(30), sent.back()->Done());
    }
    auto target = Allocate(1, sizes);
    for (int t = 0; t < kQueued; ++t) {
      for (auto& piece : target) ASSERT_TRUE(piece->Fill(0xA5));  // nothing left from the last one
      absl::Status received = receiver_->Recv(Spans(target), Clock::now() + std::chrono::seconds(30));
      ASSERT_TRUE(received.ok()) << "transfer " << t << ": " << received;
      for (size_t p = 0; p < sizes.size(); ++p) {
        EXPECT_TRUE(target[p]->Download() == originals[t][p])
            << "batch " << batch << " transfer " << t << " piece " << p << " (" << sizes[p] << " bytes) differs";
      }
    }
    for (int t = 0; t < kQueued; ++t) EXPECT_TRUE(sent[t]->Wait().ok()) << "transfer " << t;
  }
  EXPECT_TRUE(sender_->alive());
  EXPECT_TRUE(receiver_->alive());
}

TEST_F(CudaNcclPeerLinkTest, RecvWithoutSendEndsAtItsDeadline) {
  // Twice: on a fresh link (the receive waits in NCCL's connection to the peer) and after a
  // transfer (its kernel waits for data that never comes).
  for (bool warm : {false, true}) {
    SCOPED_TRACE(warm ? "after a transfer" : "first use");
    ASSERT_NO_FATAL_FAILURE(Connect());
    if (warm) {
      ASSERT_NO_FATAL_FAILURE(TransferOnce({4096, 1 << 20}));
    }
    auto target = Allocate(1, {kBigPiece});
    const auto start = Clock::now();
    const absl::Status status = receiver_->Recv(Spans(target), start + kShortDeadline);
    const double seconds = Seconds(start);
    EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
    EXPECT_GE(seconds, 0.9 * kShortDeadline.count() / 1000.0);
    EXPECT_LT(seconds, (kShortDeadline + kMargin).count() / 1000.0);
    EXPECT_FALSE(receiver_->alive());
    const auto again = Clock::now();
    EXPECT_FALSE(receiver_->Recv(Spans(target), again + std::chrono::seconds(10)).ok());
    EXPECT_LT(Seconds(again), 0.1) << "a dead link fails at once";
    TearDown();
  }
}

TEST_F(CudaNcclPeerLinkTest, SendWithoutRecvFailsAtItsDeadlineAndSoDoesWhatIsQueued) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  ASSERT_NO_FATAL_FAILURE(TransferOnce({4096, 1 << 20}));
  auto source = Allocate(0, {kBigPiece});
  Outcome first, queued, late;
  const auto start = Clock::now();
  sender_->Send(Views(source), start + kShortDeadline, first.Done());
  sender_->Send(Views(source), start + std::chrono::seconds(30), queued.Done());
  const absl::Status status = first.Wait();
  const double seconds = Seconds(start);
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_LT(seconds, (kShortDeadline + kMargin).count() / 1000.0);
  const absl::Status queued_status = queued.Wait(milliseconds(2000));
  EXPECT_EQ(queued_status.code(), absl::StatusCode::kAborted) << queued_status;
  EXPECT_FALSE(sender_->alive());
  sender_->Send(Views(source), Clock::now() + std::chrono::seconds(30), late.Done());
  EXPECT_EQ(late.Wait(milliseconds(100)).code(), absl::StatusCode::kAborted) << "a dead link fails at once";
}

TEST_F(CudaNcclPeerLinkTest, AbortFromAnotherThreadEndsAWaitingRecv) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  ASSERT_NO_FATAL_FAILURE(TransferOnce({4096, 1 << 20}));
  auto target = Allocate(1, {kBigPiece});
  Clock::time_point aborted_at;
  std::thread aborter([&] {
    std::this_thread::sleep_for(milliseconds(150));
    aborted_at = Clock::now();
    receiver_->Abort();
    receiver_->Abort();  // idempotent
  });
  const absl::Status status = receiver_->Recv(Spans(target), Clock::now() + std::chrono::seconds(30));
  const auto returned_at = Clock::now();
  aborter.join();
  EXPECT_FALSE(status.ok());
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted) << status;
  EXPECT_LT(std::chrono::duration<double>(returned_at - aborted_at).count(), 2.0);
  EXPECT_FALSE(receiver_->alive());
}

TEST_F(CudaNcclPeerLinkTest, AbortAndDestructionCallEveryQueuedDone) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  ASSERT_NO_FATAL_FAILURE(TransferOnce({4096}));
  auto source = Allocate(0, {kBigPiece});
  std::vector<std::unique_ptr<Outcome>> sent;
  for (int i = 0; i < 3; ++i) {
    sent.push_back(std::make_unique<Outcome>());
    sender_->Send(Views(source), Clock::now() + std::chrono::seconds(30), sent.back()->Done());
  }
  std::this_thread::sleep_for(milliseconds(100));  // the first is in flight, waiting for a receiver
  const auto start = Clock::now();
  sender_->Abort();
  for (auto& s : sent) EXPECT_EQ(s->Wait(milliseconds(2000)).code(), absl::StatusCode::kAborted);
  EXPECT_LT(Seconds(start), 2.0);

  // A link destroyed with transfers queued fails them too.
  ASSERT_NO_FATAL_FAILURE(Connect());
  ASSERT_NO_FATAL_FAILURE(TransferOnce({4096}));
  sent.clear();
  for (int i = 0; i < 2; ++i) {
    sent.push_back(std::make_unique<Outcome>());
    sender_->Send(Views(source), Clock::now() + std::chrono::seconds(30), sent.back()->Done());
  }
  sender_.reset();
  for (auto& s : sent) EXPECT_EQ(s->Wait(milliseconds(100)).code(), absl::StatusCode::kAborted);
}

TEST_F(CudaNcclPeerLinkTest, JoinWithoutThePeerEndsAtItsDeadline) {
  for (int rank : {0, 1}) {
    SCOPED_TRACE(::testing::Message() << "rank " << rank << " alone");
    absl::StatusOr<std::string> id = NewPeerLinkId(kSender);
    ASSERT_TRUE(id.ok()) << id.status();
    const auto start = Clock::now();
    auto link = ConnectPeerLink(rank == 0 ? kSender : kReceiver, *id, rank, start + kShortDeadline);
    const double seconds = Seconds(start);
    EXPECT_EQ(link.status().code(), absl::StatusCode::kDeadlineExceeded) << link.status();
    EXPECT_LT(seconds, (kShortDeadline + kMargin).count() / 1000.0);
  }
  auto malformed = ConnectPeerLink(kSender, "not an id", 0, Clock::now() + std::chrono::seconds(1));
  EXPECT_EQ(malformed.status().code(), absl::StatusCode::kInvalidArgument) << malformed.status();
}

}  // namespace
}  // namespace lazykv::testing
