#include "worker/tier/step_cost_fit.h"

#include <cmath>
#include <limits>
#include <vector>

namespace lazykv {
namespace {

// Terms scaled to similar magnitudes, so the normal equations stay well conditioned.
constexpr double kScale[] = {1.0, 1e-3, 1e-2, 1e-5};

// Solves A b = r for the terms in `use` (by Gaussian elimination with partial pivoting);
// false when the system is singular there (a term that did not vary apart from others).
template <size_t N>
bool SolveSubset(const std::array<std::array<double, N>, N>& a, const std::array<double, N>& r,
                 const std::vector<int>& use, std::array<double, N>* b) {
  const size_t n = use.size();
  std::vector<std::vector<double>> m(n, std::vector<double>(n + 1));
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < n; ++j) m[i][j] = a[use[i]][use[j]];
    m[i][n] = r[use[i]];
  }
  for (size_t col = 0; col < n; ++col) {
    size_t pivot = col;
    for (size_t i = col + 1; i < n; ++i) {
      if (std::abs(m[i][col]) > std::abs(m[pivot][col])) pivot = i;
    }
    // Relative to the term's own spread: below it, the term is a combination of the others.
    if (std::abs(m[pivot][col]) <= 1e-6 * std::max(1e-300, a[use[col]][use[col]])) return false;
    std::swap(m[pivot], m[col]);
    for (size_t i = 0; i < n; ++i) {
      if (i == col) continue;
      const double f = m[i][col] / m[col][col];
      for (size_t j = col; j <= n; ++j) m[i][j] -= f * m[col][j];
    }
  }
  b->fill(0);
  for (size_t i = 0; i < n; ++i) (*b)[use[i]] = m[i][n] / m[i][i];
  return true;
}

}  // namespace

void StepCostFit::Add(const StepShape& step, double seconds) {
  const double x[kTerms] = {kScale[0], step.prefill_tokens * kScale[1], step.decode_rows * kScale[2],
                            static_cast<double>(step.decode_kv_tokens) * kScale[3]};
  for (int i = 0; i < kTerms; ++i) {
    for (int j = 0; j < kTerms; ++j) xx_[i][j] = xx_[i][j] * decay_ + x[i] * x[j];
    xy_[i] = xy_[i] * decay_ + x[i] * seconds;
  }
  yy_ = yy_ * decay_ + seconds * seconds;
  ++samples_;
}

std::optional<double> StepCostFit::PrefillSecondsPerToken() const {
  // Non-negative least squares by trying every set of terms that keeps the base and the
  // prefill term (four sets) and keeping the best fit whose costs are all >= 0. The base
  // stays: every step has a fixed cost (the weights read once, the launches), and without
  // it a prefill rate through the origin would absorb that cost.
  std::optional<double> best_prefill;
  double best_residual = std::numeric_limits<double>::infinity();
  for (int mask = 0; mask < 4; ++mask) {
    std::vector<int> use{0, 1};
    if (mask & 1) use.push_back(2);
    if (mask & 2) use.push_back(3);
    std::array<double, kTerms> b{};
    if (!SolveSubset(xx_, xy_, use, &b)) continue;
    bool feasible = true;
    for (int t : use) feasible = feasible && b[t] >= 0;
    if (!feasible || b[1] <= 0) continue;
    // Weighted squared residual: yy - 2 b.xy + b^T xx b.
    double residual = yy_;
    for (int i = 0; i < kTerms; ++i) {
      residual -= 2 * b[i] * xy_[i];
      for (int j = 0; j < kTerms; ++j) residual += b[i] * xx_[i][j] * b[j];
    }
    if (residual < best_residual) {
      best_residual = residual;
      best_prefill = b[1] * kScale[1];
    }
  }
  return best_prefill;
}

}  // namespace lazykv
