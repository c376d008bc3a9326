// RoPE on the CPU (reference): rotates one head vector by position * theta_i, with the
// angle formed in double precision so large positions and deltas stay exact.
#pragma once

#include <cstdint>
#include <vector>

#include "common/model_config.h"

namespace lazykv::cpu {

class RopeTable {
 public:
  RopeTable(const RopeConfig& rope, int head_dim);

  // Rotates `vec` (head_dim floats) in place by R(position); position may be negative.
  void Rotate(float* vec, int64_t position) const;
  // Rotates every head of a row of `n_heads` consecutive head vectors.
  void RotateHeads(float* row, int n_heads, int64_t position) const;

  int head_dim() const { return head_dim_; }

 private:
  RopeStyle style_;
  int head_dim_;
  std::vector<double> inv_freq_;
};

}  // namespace lazykv::cpu
