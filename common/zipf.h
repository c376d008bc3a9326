// Zipf(s) popularity over ranks 0..n-1: P(rank k) proportional to 1 / (k + 1)^s (s = 0 is
// uniform). Sampled by inverse CDF over a precomputed table with a portable generator,
// so a seed gives the same trace everywhere.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "common/splitmix64.h"

namespace lazykv {

// Immutable after construction; Sample draws from the caller's generator, so it is
// thread-safe as long as each thread brings its own.
class ZipfSampler {
 public:
  ZipfSampler(size_t n, double s) : cdf_(n) {
    double total = 0;
    for (size_t k = 0; k < n; ++k) cdf_[k] = (total += std::pow(static_cast<double>(k + 1), -s));
    for (double& c : cdf_) c /= total;
  }
  size_t size() const { return cdf_.size(); }
  double Probability(size_t rank) const { return cdf_[rank] - (rank == 0 ? 0.0 : cdf_[rank - 1]); }
  size_t Sample(uint64_t& rng_state) const {
    const double u = SplitMix64Unit(rng_state);
    return std::min<size_t>(std::upper_bound(cdf_.begin(), cdf_.end(), u) - cdf_.begin(), cdf_.size() - 1);
  }

 private:
  std::vector<double> cdf_;
};

}  // namespace lazykv
