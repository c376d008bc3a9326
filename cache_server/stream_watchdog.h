// Cancels server calls that make no progress for an idle timeout. A gRPC handler blocked in
// a stream's Read (a client that opened a Put and sends nothing) or Write (a client that
// stops reading a Get) has no timeout of its own, and would hold its stream slot and the
// space reserved for its chunk for as long as the client likes. The watchdog cancels such
// a call (ServerContext::TryCancel), which ends the blocked Read or Write.
// Thread-safe: handlers on any thread hold Watches; one thread of its own scans.
#pragma once

#include <grpcpp/server_context.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <thread>

#include "common/mutex.h"

namespace lazykv::cache {

class StreamWatchdog {
 public:
  using Clock = std::chrono::steady_clock;

  explicit StreamWatchdog(std::chrono::milliseconds idle_timeout);
  ~StreamWatchdog();  // stops the scanning thread; every Watch must be gone
  StreamWatchdog(const StreamWatchdog&) = delete;
  StreamWatchdog& operator=(const StreamWatchdog&) = delete;

  // Watches `context` while alive. REQUIRES: the context outlives the Watch (a handler's
  // local Watch does).
  class Watch {
   public:
    Watch(StreamWatchdog* dog, grpc::ServerContext* context);
    ~Watch();
    Watch(const Watch&) = delete;
    Watch& operator=(const Watch&) = delete;
    // The call moved (a message read or written): its idle time starts over.
    void Progress();
    // Whether the watchdog cancelled the call for idleness.
    bool timed_out() const;

   private:
    StreamWatchdog* dog_;
    uint64_t id_;
  };

 private:
  struct Entry {
    grpc::ServerContext* context;
    Clock::time_point last_progress;
    bool cancelled = false;
  };
  void Scan();

  const std::chrono::milliseconds idle_timeout_;
  mutable Mutex mu_;
  std::map<uint64_t, Entry> entries_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  CondVar wake_;
  std::thread thread_;  // last: starts after the state it reads
};

}  // namespace lazykv::cache
