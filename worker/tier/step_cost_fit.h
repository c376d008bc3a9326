// A forward step's time split by what it ran (DESIGN.md section 4): step seconds =
// base + a * prefill tokens + b * decode rows + c * KV tokens the decode rows read, fitted
// by exponentially weighted non-negative least squares over recent steps. `a` is the
// marginal cost of a prefill token, what recomputing a chunk in the current batch costs.
// A fit of step time against prefill tokens alone read it 3x too high on the H100: steps
// with more prefill also had more decoding rows with longer contexts.
#pragma once

#include <array>
#include <cstdint>
#include <optional>

namespace lazykv {

struct StepShape {
  int prefill_tokens = 0;
  int decode_rows = 0;
  int64_t decode_kv_tokens = 0;  // context tokens attended by the decode rows, summed
};

// Not thread-safe.
class StepCostFit {
 public:
  explicit StepCostFit(double decay) : decay_(decay) {}
  void Add(const StepShape& step, double seconds);
  uint64_t samples() const { return samples_; }
  // Seconds per prefill token; nullopt until the steps seen vary enough in prefill (apart
  // from how they vary in decoding) for it to be told apart, or when no fit with
  // non-negative costs explains them.
  std::optional<double> PrefillSecondsPerToken() const;

 private:
  static constexpr int kTerms = 4;  // base, prefill tokens, decode rows, decode KV tokens
  double decay_;
  std::array<std::array<double, kTerms>, kTerms> xx_{};  // decayed sums of x x^T
  std::array<double, kTerms> xy_{};                       // and of x y
  double yy_ = 0;
  uint64_t samples_ = 0;
};

}  // namespace lazykv
