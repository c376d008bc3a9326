#include "cache_server/process_watch.h"

#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_format.h"

namespace lazykv::cache {

absl::StatusOr<std::unique_ptr<ProcessWatch>> ProcessWatch::Open(int pid) {
  if (pid <= 0) return absl::InvalidArgumentError(absl::StrFormat("pid %d", pid));
#ifdef SYS_pidfd_open
  const int fd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) {
    const int err = errno;
    if (err == ENOSYS) return absl::UnimplementedError("pidfd_open: not supported by this kernel");
    return absl::NotFoundError(absl::StrFormat("process %d: %s", pid, std::strerror(err)));
  }
  return std::unique_ptr<ProcessWatch>(new ProcessWatch(pid, fd));
#else
  return absl::UnimplementedError("pidfd_open: not supported by this system's headers");
#endif
}

ProcessWatch::~ProcessWatch() { close(fd_); }

bool ProcessWatch::Alive() const {
  // A pidfd polls readable once its process has terminated.
  pollfd p{.fd = fd_, .events = POLLIN, .revents = 0};
  const int ready = poll(&p, 1, 0);
  return ready == 0;
}

}  // namespace lazykv::cache
