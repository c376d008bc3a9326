#include "worker/tier/server_estimator.h"

#include <algorithm>
#include <cmath>

namespace lazykv {
namespace {

using std::chrono::microseconds;

// RFC 6298's gains: 1/8 for the mean, 1/4 for the deviation; 1/4 for throughput, which
// has fewer samples (one per transfer).
constexpr double kMeanGain = 0.125;
constexpr double kDeviationGain = 0.25;
constexpr double kBandwidthGain = 0.25;

microseconds FromMs(double ms) { return microseconds(static_cast<int64_t>(std::ceil(ms * 1000))); }

}  // namespace

void ServerEstimator::ObserveCall(std::chrono::nanoseconds elapsed) {
  const double ms = std::chrono::duration<double, std::milli>(elapsed).count();
  if (latency_samples_++ == 0) {
    mean_ms_ = ms;
    deviation_ms_ = ms / 2;
    return;
  }
  deviation_ms_ += kDeviationGain * (std::abs(mean_ms_ - ms) - deviation_ms_);
  mean_ms_ += kMeanGain * (ms - mean_ms_);
}

void ServerEstimator::ObserveTransfer(uint64_t bytes, std::chrono::nanoseconds elapsed) {
  ObserveChunkSize(bytes);
  const double seconds = std::chrono::duration<double>(elapsed).count();
  if (bytes == 0 || seconds <= 0) return;
  const double sample = static_cast<double>(bytes) / seconds;
  bandwidth_ = bandwidth_ == 0 ? sample : bandwidth_ + kBandwidthGain * (sample - bandwidth_);
}

void ServerEstimator::ObserveChunkSize(uint64_t bytes) { largest_chunk_ = std::max(largest_chunk_, bytes); }

microseconds ServerEstimator::CallDeadline() const {
  if (latency_samples_ == 0) return std::min<microseconds>(policy_.initial_call, policy_.max_call);
  return std::clamp<microseconds>(FromMs(mean_ms_ + 4 * deviation_ms_), policy_.min_call, policy_.max_call);
}

microseconds ServerEstimator::TransferDeadline(uint64_t bytes) const {
  if (bytes == 0) bytes = largest_chunk_ > 0 ? largest_chunk_ : kAssumedChunkBytes;
  const double rate = bandwidth_ > 0 ? bandwidth_ : kAssumedBandwidth;
  const microseconds call = CallDeadline();
  const microseconds transfer = call + FromMs(4 * 1000 * static_cast<double>(bytes) / rate);
  return std::clamp<microseconds>(transfer, call, std::max<microseconds>(call, policy_.max_transfer));
}

}  // namespace lazykv
