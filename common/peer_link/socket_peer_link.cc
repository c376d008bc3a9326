#include "common/peer_link/socket_peer_link.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <deque>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/mutex.h"

namespace lazykv {
namespace {

using Clock = PeerLinkClock;
constexpr std::string_view kIdPrefix = "lazykv-peer-link-";
constexpr uint32_t kFrameMagic = 0x4c4b504c;  // "LKPL"

int MillisLeft(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(std::min<int64_t>(left, 100));  // wake often: Abort may come
}

sockaddr_un AddressOf(std::string_view id, socklen_t* length) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  // Abstract namespace: a leading NUL, no file to clean up after a crash.
  std::memcpy(address.sun_path + 1, id.data(), id.size());
  *length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + id.size());
  return address;
}

// Moves all of `bytes` through the non-blocking socket `fd` (send when `out`, else receive),
// waiting in poll() slices so that `dead` (Abort) and the deadline are seen promptly.
absl::Status Transfer(int fd, char* bytes, uint64_t size, bool out, Clock::time_point deadline,
                      const std::atomic<bool>& dead) {
  uint64_t done = 0;
  while (done < size) {
    if (dead.load()) return absl::AbortedError("peer link aborted");
    const ssize_t n = out ? ::send(fd, bytes + done, size - done, MSG_NOSIGNAL)
                          : ::recv(fd, bytes + done, size - done, 0);
    if (n > 0) {
      done += static_cast<uint64_t>(n);
      continue;
    }
    if (n == 0) return absl::AbortedError("peer link: the peer closed the connection");
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      return absl::AbortedError(absl::StrCat("peer link: ", out ? "send" : "recv", ": ", std::strerror(errno)));
    }
    if (Clock::now() >= deadline) return absl::DeadlineExceededError("peer link transfer passed its deadline");
    pollfd p{fd, static_cast<short>(out ? POLLOUT : POLLIN), 0};
    (void)::poll(&p, 1, std::max(1, MillisLeft(deadline)));
  }
  return absl::OkStatus();
}

class SocketPeerLink final : public PeerLink {
 public:
  explicit SocketPeerLink(int fd) : fd_(fd), sender_([this] { SendLoop(); }) {}
  ~SocketPeerLink() override {
    Abort();
    sender_.join();
    ::close(fd_);
  }

  void Send(std::vector<std::string_view> pieces, Clock::time_point deadline,
            std::function<void(absl::Status)> done) override {
    {
      MutexLock lock(&mu_);
      if (!dead_.load()) {
        queue_.push_back(Job{std::move(pieces), deadline, std::move(done)});
        work_.Signal();
        return;
      }
    }
    done(absl::AbortedError("peer link is dead"));
  }

  absl::Status Recv(std::vector<std::span<char>> pieces, Clock::time_point deadline) override {
    if (dead_.load()) return absl::AbortedError("peer link is dead");
    absl::Status status = RecvFrame(pieces, deadline);
    if (!status.ok()) Abort();
    return status;
  }

  bool alive() const override { return !dead_.load(); }

  void Abort() override {
    if (dead_.exchange(true)) return;
    ::shutdown(fd_, SHUT_RDWR);  // the peer sees the end at once
    MutexLock lock(&mu_);
    work_.SignalAll();
  }

  std::string_view kind() const override { return "socket"; }

 private:
  struct Frame {
    uint32_t magic;
    uint32_t reserved;
    uint64_t bytes;  // the transfer's total
  };
  struct Job {
    std::vector<std::string_view> pieces;
    Clock::time_point deadline;
    std::function<void(absl::Status)> done;
  };

  absl::Status RecvFrame(std::vector<std::span<char>>& pieces, Clock::time_point deadline) {
    Frame frame;
    absl::Status status = Transfer(fd_, reinterpret_cast<char*>(&frame), sizeof(frame), false, deadline, dead_);
    if (!status.ok()) return status;
    if (frame.magic != kFrameMagic) return absl::InternalError("peer link: malformed frame");
    uint64_t expected = 0;
    for (std::span<char> piece : pieces) expected += piece.size();
    if (frame.bytes != expected) {
      return absl::InternalError(
          absl::StrFormat("peer link: the sender sent %d bytes, the receiver expected %d", frame.bytes, expected));
    }
    for (std::span<char> piece : pieces) {
      status = Transfer(fd_, piece.data(), piece.size(), false, deadline, dead_);
      if (!status.ok()) return status;
    }
    return absl::OkStatus();
  }

  absl::Status SendFrame(const Job& job) {
    Frame frame{kFrameMagic, 0, 0};
    for (std::string_view piece : job.pieces) frame.bytes += piece.size();
    absl::Status status = Transfer(fd_, reinterpret_cast<char*>(&frame), sizeof(frame), true, job.deadline, dead_);
    for (std::string_view piece : job.pieces) {
      if (!status.ok()) break;
      status = Transfer(fd_, const_cast<char*>(piece.data()), piece.size(), true, job.deadline, dead_);
    }
    return status;
  }

  void SendLoop() {
    MutexLock lock(&mu_);
    while (true) {
      while (queue_.empty() && !dead_.load()) work_.Wait(&mu_);
      if (queue_.empty()) return;  // dead, nothing left to fail
      Job job = std::move(queue_.front());
      queue_.pop_front();
      lock.Unlock();
      absl::Status status = dead_.load() ? absl::AbortedError("peer link aborted") : SendFrame(job);
      if (!status.ok()) Abort();
      job.done(status);
      lock.Lock();
    }
  }

  const int fd_;
  std::atomic<bool> dead_{false};
  Mutex mu_;
  CondVar work_;
  std::deque<Job> queue_ ABSL_GUARDED_BY(mu_);
  std::thread sender_;  // last: started once the rest is built
};

absl::Status SetNonBlocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    return absl::InternalError(absl::StrCat("peer link: fcntl: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<int> Listen(std::string_view id, Clock::time_point deadline, const std::atomic<bool>* cancel) {
  const int listener = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (listener < 0) return absl::InternalError(absl::StrCat("peer link: socket: ", std::strerror(errno)));
  socklen_t length;
  const sockaddr_un address = AddressOf(id, &length);
  if (::bind(listener, reinterpret_cast<const sockaddr*>(&address), length) < 0 || ::listen(listener, 1) < 0) {
    const std::string error = std::strerror(errno);
    ::close(listener);
    return absl::InternalError(absl::StrCat("peer link: bind/listen: ", error));
  }
  while (true) {
    const int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd >= 0) {
      ::close(listener);  // one peer per link
      return fd;
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      const std::string error = std::strerror(errno);
      ::close(listener);
      return absl::InternalError(absl::StrCat("peer link: accept: ", error));
    }
    if (Clock::now() >= deadline) {
      ::close(listener);
      return absl::DeadlineExceededError("peer link: the peer did not join in time");
    }
    if (cancel != nullptr && cancel->load()) {
      ::close(listener);
      return absl::CancelledError("peer link: the join was given up");
    }
    pollfd p{listener, POLLIN, 0};
    (void)::poll(&p, 1, std::max(1, MillisLeft(deadline)));
  }
}

absl::StatusOr<int> Dial(std::string_view id, Clock::time_point deadline, const std::atomic<bool>* cancel) {
  socklen_t length;
  const sockaddr_un address = AddressOf(id, &length);
  while (true) {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return absl::InternalError(absl::StrCat("peer link: socket: ", std::strerror(errno)));
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&address), length) == 0) {
      absl::Status status = SetNonBlocking(fd);
      if (!status.ok()) {
        ::close(fd);
        return status;
      }
      return fd;
    }
    const int error = errno;
    ::close(fd);
    // The sender may not be listening yet: both sides join at the same time.
    if (error != ECONNREFUSED && error != ENOENT && error != EAGAIN) {
      return absl::InternalError(absl::StrCat("peer link: connect: ", std::strerror(error)));
    }
    if (Clock::now() >= deadline) return absl::DeadlineExceededError("peer link: the peer did not join in time");
    if (cancel != nullptr && cancel->load()) return absl::CancelledError("peer link: the join was given up");
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

}  // namespace

absl::StatusOr<std::string> NewSocketPeerLinkId() {
  std::random_device random;
  const uint64_t a = (uint64_t{random()} << 32) | random();
  const uint64_t b = (uint64_t{random()} << 32) | random();
  return absl::StrFormat("%s%016x%016x", kIdPrefix, a, b);
}

absl::StatusOr<std::unique_ptr<PeerLink>> ConnectSocketPeerLink(std::string_view id, int rank,
                                                                Clock::time_point deadline,
                                                                const std::atomic<bool>* cancel) {
  if (id.substr(0, kIdPrefix.size()) != kIdPrefix || id.size() != kIdPrefix.size() + 32) {
    return absl::InvalidArgumentError("malformed socket peer link id");
  }
  auto fd = rank == 0 ? Listen(id, deadline, cancel) : Dial(id, deadline, cancel);
  if (!fd.ok()) return fd.status();
  return std::unique_ptr<PeerLink>(new SocketPeerLink(*fd));
}

}  // namespace lazykv
