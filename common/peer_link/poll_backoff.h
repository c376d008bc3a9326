// How the NCCL link's waits poll (nccl_peer_link_cuda.cc): yielding for the first 2 ms (a
// 64 MiB chunk over NVLink takes a few hundred microseconds, and a sleep's wake-up latency
// would be a large part of it), then sleeping 50 us, doubling up to 1 ms (a stalled peer
// costs no CPU; Abort and deadlines are seen within a millisecond). One per wait; not
// thread-safe.
#pragma once

#include <algorithm>
#include <chrono>
#include <thread>

namespace lazykv {

class PollBackoff {
 public:
  void Pause() {
    if (std::chrono::steady_clock::now() - start_ < kSpinFor) {
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(sleep_);
    sleep_ = std::min(sleep_ * 2, kMaxSleep);
  }

 private:
  static constexpr std::chrono::microseconds kSpinFor{2000};
  static constexpr std::chrono::microseconds kMaxSleep{1000};
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::chrono::microseconds sleep_{50};
};

}  // namespace lazykv
