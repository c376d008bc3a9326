// What a worker has observed of one cache server: the round-trip latency of its small
// calls (lookup, lease, release, health check) and the throughput of its transfers (get,
// put), as moving averages, and the deadlines derived from them (DESIGN.md section 4).
//
// Latency follows TCP's retransmission timer (RFC 6298): a smoothed mean and a smoothed
// mean deviation; a small call's deadline is mean + 4 deviations, between a floor and a
// ceiling. A transfer's deadline adds 4 times the time its bytes take at the observed
// throughput. Before any sample, small calls get `initial_call`, transfers assume
// kAssumedBandwidth.
#pragma once

#include <chrono>
#include <cstdint>

namespace lazykv {

struct DeadlinePolicy {
  std::chrono::milliseconds initial_call{100};    // a small call before any sample
  std::chrono::milliseconds min_call{20};         // floor of a small call's deadline
  std::chrono::milliseconds max_call{2000};       // ceiling of a small call's deadline
  std::chrono::milliseconds max_transfer{60000};  // ceiling of a transfer's deadline
};

// Not thread-safe: RemoteChunkTier keeps one per server, behind that server's mutex.
class ServerEstimator {
 public:
  // Transfers before any throughput sample assume this (bytes/s): slow enough for a
  // gigabit link with room to spare.
  static constexpr double kAssumedBandwidth = 100e6;
  // A get's size before any chunk of this server has been seen.
  static constexpr uint64_t kAssumedChunkBytes = 4 << 20;

  explicit ServerEstimator(DeadlinePolicy policy) : policy_(policy) {}

  // A small call answered after `elapsed`.
  void ObserveCall(std::chrono::nanoseconds elapsed);
  // A transfer of `bytes` that took `elapsed` (latency included); also a chunk's size.
  void ObserveTransfer(uint64_t bytes, std::chrono::nanoseconds elapsed);
  // A chunk of this server has `bytes` (a lookup's answer): sizes a get's deadline.
  void ObserveChunkSize(uint64_t bytes);

  std::chrono::microseconds CallDeadline() const;
  // For `bytes`, or the largest chunk seen when 0 (a get, whose size is not known).
  std::chrono::microseconds TransferDeadline(uint64_t bytes) const;

  double latency_ms() const { return latency_samples_ > 0 ? mean_ms_ : 0; }  // 0: no sample yet
  double bandwidth_bytes_per_s() const { return bandwidth_; }                // 0: no sample yet

 private:
  const DeadlinePolicy policy_;
  double mean_ms_ = 0;
  double deviation_ms_ = 0;
  uint64_t latency_samples_ = 0;
  double bandwidth_ = 0;
  uint64_t largest_chunk_ = 0;
};

}  // namespace lazykv
