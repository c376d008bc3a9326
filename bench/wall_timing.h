// Wall-clock timing shared by the benchmarks whose work synchronizes itself (copies that
// wait, calls into a backend): medians after warm-ups, and a candidate timed in alternation
// with its baseline.
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

namespace lazykv::bench {

inline double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// Median wall time of fn() (which synchronizes) over reps runs after 3 warm-ups.
template <typename Fn>
double MedianSeconds(Fn&& fn, int reps) {
  for (int i = 0; i < 3; ++i) fn();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    t.push_back(Seconds(start));
  }
  std::nth_element(t.begin(), t.begin() + reps / 2, t.end());
  return t[reps / 2];
}

// A candidate against its baseline, timed in alternation (baseline, candidate, baseline, ...)
// after 3 warm-ups of each, so that drift of the PCIe link or the clocks over the run falls
// on both alike: the medians of each and the median of the per-pair ratios.
struct Paired {
  double baseline_s, candidate_s, ratio;  // ratio: baseline time / candidate time
};
template <typename Base, typename Candidate>
Paired PairedMedians(Base&& base, Candidate&& candidate, int reps) {
  for (int i = 0; i < 3; ++i) {
    base();
    candidate();
  }
  std::vector<double> b, c, r;
  for (int i = 0; i < reps; ++i) {
    auto start = std::chrono::steady_clock::now();
    base();
    b.push_back(Seconds(start));
    start = std::chrono::steady_clock::now();
    candidate();
    c.push_back(Seconds(start));
    r.push_back(b.back() / c.back());
  }
  auto median = [](std::vector<double>& v) {
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    return v[v.size() / 2];
  };
  return Paired{median(b), median(c), median(r)};
}

}  // namespace lazykv::bench
