// The socket kind of common/peer_link/ (the NCCL link's CPU twin, which the cache server's
// emulated GPU tier uses): transfers arrive byte for byte and in order between two threads,
// scattered into pieces that need not line up with the sender's; a Recv of another size fails
// instead of being read misaligned; a join given up from another thread ends at once; every
// wait ends by its deadline, on Abort, or when the peer goes, and a dead link fails at once.
// References: the random bytes as sent.
#include "common/peer_link/peer_link.h"

#include <future>
#include <random>
#include <thread>

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace lazykv::testing {
namespace {

using std::chrono::milliseconds;
using Clock = PeerLinkClock;

struct LinkPair {
  std::unique_ptr<PeerLink> sender, receiver;
};

LinkPair Connect() {
  const PeerLinkOptions options{.kind = "socket", .device = -1, .cancel = nullptr};
  auto id = NewPeerLinkId(options);
  EXPECT_TRUE(id.ok()) << id.status();
  const auto deadline = Clock::now() + milliseconds(5000);
  auto sender = std::async(std::launch::async, [&] { return ConnectPeerLink(options, *id, 0, deadline); });
  auto receiver = ConnectPeerLink(options, *id, 1, deadline);
  auto sent = sender.get();
  EXPECT_TRUE(sent.ok()) << sent.status();
  EXPECT_TRUE(receiver.ok()) << receiver.status();
  if (!sent.ok() || !receiver.ok()) return {};
  return LinkPair{*std::move(sent), *std::move(receiver)};
}

std::string RandomBytes(std::mt19937_64& rng, size_t n) {
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

// A Send's outcome, waited for.
struct Done {
  std::promise<absl::Status> promise;
  std::function<void(absl::Status)> Callback() {
    return [this](absl::Status s) { promise.set_value(std::move(s)); };
  }
};

TEST(PeerLinkTest, TransfersArriveExactlyAndInOrder) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(seed);
  std::mt19937_64 rng(seed);
  LinkPair link = Connect();
  ASSERT_NE(link.sender, nullptr);
  EXPECT_EQ(link.sender->kind(), "socket");
  // Several transfers queued at once, of pieces of random sizes (an empty one among them,
  // and one larger than a socket's buffer): received in the order sent.
  std::vector<std::vector<std::string>> transfers(5);
  for (auto& pieces : transfers) {
    const int n = std::uniform_int_distribution<int>(1, 6)(rng);
    for (int i = 0; i < n; ++i) pieces.push_back(RandomBytes(rng, std::uniform_int_distribution<size_t>(0, 200000)(rng)));
  }
  transfers[2].push_back(RandomBytes(rng, 3 << 20));
  transfers[3].insert(transfers[3].begin(), std::string());
  std::vector<Done> done(transfers.size());
  for (size_t t = 0; t < transfers.size(); ++t) {
    std::vector<std::string_view> views(transfers[t].begin(), transfers[t].end());
    link.sender->Send(views, Clock::now() + milliseconds(10000), done[t].Callback());
  }
  for (size_t t = 0; t < transfers.size(); ++t) {
    // Received into pieces cut elsewhere than the sender's (a scatter list of the same total).
    std::string expected;
    for (const std::string& piece : transfers[t]) expected += piece;
    std::string got(expected.size(), '\0');
    std::vector<std::span<char>> pieces;
    size_t at = 0;
    while (at < got.size()) {
      const size_t n = std::min(got.size() - at, std::uniform_int_distribution<size_t>(1, 300000)(rng));
      pieces.emplace_back(got.data() + at, n);
      at += n;
    }
    ASSERT_TRUE(link.receiver->Recv(pieces, Clock::now() + milliseconds(10000)).ok()) << "transfer " << t;
    EXPECT_EQ(got, expected) << "transfer " << t;
  }
  for (Done& d : done) EXPECT_TRUE(d.promise.get_future().get().ok());
  EXPECT_TRUE(link.sender->alive());
  EXPECT_TRUE(link.receiver->alive());
}

TEST(PeerLinkTest, ARecvOfAnotherSizeFails) {
  LinkPair link = Connect();
  ASSERT_NE(link.sender, nullptr);
  const std::string a(1000, 'a'), b(500, 'b');
  Done done;
  link.sender->Send({a, b}, Clock::now() + milliseconds(5000), done.Callback());
  auto sent = done.promise.get_future();
  std::string x(1000, '\0'), y(400, '\0');  // the second piece is short
  const absl::Status status = link.receiver->Recv({std::span(x), std::span(y)}, Clock::now() + milliseconds(5000));
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << status;
  EXPECT_FALSE(link.receiver->alive()) << "out of step: dead";
  std::string z(10, '\0');
  EXPECT_FALSE(link.receiver->Recv({std::span(z)}, Clock::now() + milliseconds(5000)).ok()) << "a dead link fails at once";
  EXPECT_EQ(sent.wait_for(milliseconds(5000) * SlowdownFactor()), std::future_status::ready);  // before `done` goes
}

TEST(PeerLinkTest, ARecvNobodySendsEndsAtItsDeadline) {
  LinkPair link = Connect();
  ASSERT_NE(link.sender, nullptr);
  std::string x(100, '\0');
  const auto start = Clock::now();
  const absl::Status status = link.receiver->Recv({std::span(x)}, start + milliseconds(200));
  const auto waited = Clock::now() - start;
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_GE(waited, milliseconds(200));
  EXPECT_LT(waited, milliseconds(1500) * SlowdownFactor());
  EXPECT_FALSE(link.receiver->alive());
}

TEST(PeerLinkTest, ASendNobodyReceivesEndsAtItsDeadline) {
  LinkPair link = Connect();
  ASSERT_NE(link.sender, nullptr);
  // More than the socket buffers hold: the send cannot complete unless someone reads.
  const std::string big(64 << 20, 'x');
  Done done;
  const auto start = Clock::now();
  link.sender->Send({big}, start + milliseconds(300), done.Callback());
  auto future = done.promise.get_future();
  ASSERT_EQ(future.wait_for(milliseconds(3000) * SlowdownFactor()), std::future_status::ready);
  EXPECT_EQ(future.get().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_FALSE(link.sender->alive());
  // A Send on the dead link is answered at once.
  Done after;
  link.sender->Send({big}, Clock::now() + milliseconds(10000), after.Callback());
  EXPECT_EQ(after.promise.get_future().get().code(), absl::StatusCode::kAborted);
}

TEST(PeerLinkTest, AbortEndsAWaitingRecvAndThePeerSeesTheEnd) {
  LinkPair link = Connect();
  ASSERT_NE(link.sender, nullptr);
  std::string x(100, '\0');
  const auto start = Clock::now();
  std::thread aborter([&] {
    std::this_thread::sleep_for(milliseconds(100));
    link.receiver->Abort();
  });
  const absl::Status status = link.receiver->Recv({std::span(x)}, start + milliseconds(20000));
  aborter.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted) << status;
  EXPECT_LT(Clock::now() - start, milliseconds(2000) * SlowdownFactor());
  // The sender's next transfer fails rather than waiting out its deadline.
  const std::string big(16 << 20, 'y');
  Done done;
  link.sender->Send({big}, Clock::now() + milliseconds(20000), done.Callback());
  auto future = done.promise.get_future();
  ASSERT_EQ(future.wait_for(milliseconds(3000) * SlowdownFactor()), std::future_status::ready);
  EXPECT_FALSE(future.get().ok());
}

TEST(PeerLinkTest, APeerThatGoesEndsTheOthersTransfer) {
  LinkPair link = Connect();
  ASSERT_NE(link.sender, nullptr);
  std::string x(100, '\0');
  std::thread closer([&] {
    std::this_thread::sleep_for(milliseconds(100));
    link.sender.reset();  // the sending process exits
  });
  const auto start = Clock::now();
  const absl::Status status = link.receiver->Recv({std::span(x)}, start + milliseconds(20000));
  closer.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted) << status;
  EXPECT_LT(Clock::now() - start, milliseconds(2000) * SlowdownFactor());
}

TEST(PeerLinkTest, JoiningALinkNobodyJoinsEndsAtTheDeadline) {
  const PeerLinkOptions options{.kind = "socket", .device = -1, .cancel = nullptr};
  auto id = NewPeerLinkId(options);
  ASSERT_TRUE(id.ok());
  for (int rank : {0, 1}) {
    const auto start = Clock::now();
    auto link = ConnectPeerLink(options, *id, rank, start + milliseconds(200));
    EXPECT_EQ(link.status().code(), absl::StatusCode::kDeadlineExceeded) << "rank " << rank;
    EXPECT_LT(Clock::now() - start, milliseconds(1500) * SlowdownFactor());
  }
  // A join given up from another thread ends at once, not at its deadline.
  for (int rank : {0, 1}) {
    auto give_up = std::make_shared<std::atomic<bool>>(false);
    PeerLinkOptions cancellable = options;
    cancellable.cancel = give_up;
    std::thread canceller([&] {
      std::this_thread::sleep_for(milliseconds(100));
      give_up->store(true);
    });
    const auto start = Clock::now();
    auto link = ConnectPeerLink(cancellable, *NewPeerLinkId(options), rank, start + milliseconds(20000));
    canceller.join();
    EXPECT_EQ(link.status().code(), absl::StatusCode::kCancelled) << "rank " << rank;
    EXPECT_LT(Clock::now() - start, milliseconds(2000) * SlowdownFactor());
  }
  EXPECT_EQ(ConnectPeerLink(options, "not-an-id", 1, Clock::now()).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ConnectPeerLink(options, *id, 2, Clock::now()).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PeerLinkAvailable("carrier-pigeon").code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace lazykv::testing
