// Whether a process on this host still runs, by a pidfd (pidfd_open, Linux 5.3): unlike a
// pid, it names one process for good, so a pid reused after the process exits is never
// taken for it. A same-host worker's session hands its pid to the cache server, which holds
// the pages a worker reads or writes in place until that process is gone (DESIGN.md
// section 5: a frozen worker's session can end while the process lives on).
#pragma once

#include <memory>

#include "absl/status/statusor.h"

namespace lazykv::cache {

// Thread-safe (immutable after Open).
class ProcessWatch {
 public:
  // NOT_FOUND when no process `pid` exists (or it cannot be seen from here: another PID
  // namespace); UNIMPLEMENTED where the kernel has no pidfd_open; INVALID_ARGUMENT for pid <= 0.
  static absl::StatusOr<std::unique_ptr<ProcessWatch>> Open(int pid);
  ~ProcessWatch();
  ProcessWatch(const ProcessWatch&) = delete;
  ProcessWatch& operator=(const ProcessWatch&) = delete;

  int pid() const { return pid_; }
  // False once the process has exited (a zombie not yet reaped counts as exited).
  bool Alive() const;

 private:
  ProcessWatch(int pid, int fd) : pid_(pid), fd_(fd) {}
  const int pid_;
  const int fd_;
};

}  // namespace lazykv::cache
