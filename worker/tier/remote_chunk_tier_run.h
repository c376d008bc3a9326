// RemoteChunkTier::Run, the retry-and-deadline loop of every call to a cache server, for
// the files that define RemoteChunkTier's members (remote_chunk_tier.cc and
// remote_chunk_tier_shm.cc). Not for other includers.
#pragma once

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <thread>

#include "absl/strings/str_format.h"
#include "worker/tier/remote_chunk_tier.h"

namespace lazykv {

inline bool RetryableCacheCall(grpc::StatusCode code) {
  return code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::ABORTED;
}

template <typename Call>
RemoteChunkTier::Attempted RemoteChunkTier::Run(Server& server, std::chrono::microseconds deadline, int retries,
                                                std::string_view name, Call call) {
  Attempted out;
  for (int attempt = 0;; ++attempt) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + deadline);
    {
      MutexLock lock(&server.mu);
      if (!server.up) {
        out.status = grpc::Status(grpc::StatusCode::UNAVAILABLE, "cache server " + server.address + " is down");
        return out;
      }
      server.in_flight.insert(&context);
    }
    const auto start = std::chrono::steady_clock::now();
    out.status = call(context);
    out.elapsed = std::chrono::steady_clock::now() - start;
    {
      MutexLock lock(&server.mu);
      server.in_flight.erase(&context);
    }
    const grpc::StatusCode code = out.status.error_code();
    if (code == grpc::StatusCode::DEADLINE_EXCEEDED) {
      MarkDown(server, out.status,
               absl::StrFormat("%s (deadline %.1f ms)", std::string(name), deadline.count() / 1000.0));
      return out;
    }
    if (!RetryableCacheCall(code) || attempt >= retries) {
      if (code == grpc::StatusCode::UNAVAILABLE) MarkDown(server, out.status, name);
      // Wrong or missing credentials make every call a miss: say so once, loudly, instead
      // of serving quietly without the tier. (A put may also be denied for a lease another
      // worker holds; a lookup is denied only for want of the worker role.)
      const bool refused = code == grpc::StatusCode::UNAUTHENTICATED ||
                           (code == grpc::StatusCode::PERMISSION_DENIED && name == "lookup");
      if (refused && !server.refusal_logged.exchange(true)) {
        spdlog::error(
            "cache server {} refused this worker's credentials ({}); its chunks are computed (check "
            "--cache-auth-token and --cache-tls-*)",
            server.address, out.status.error_message());
      }
      return out;
    }
    std::this_thread::sleep_for(options_.retry_delay);
  }
}

}  // namespace lazykv
