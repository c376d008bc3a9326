#include "kernels/cpu/rope.h"

#include <cmath>

namespace lazykv::cpu {

RopeTable::RopeTable(const RopeConfig& rope, int head_dim)
    : style_(rope.style), head_dim_(head_dim), inv_freq_(RopeInverseFrequencies(rope, head_dim)) {}

void RopeTable::Rotate(float* vec, int64_t position) const {
  const int half = head_dim_ / 2;
  for (int i = 0; i < half; ++i) {
    const double angle = static_cast<double>(position) * inv_freq_[i];
    const float c = static_cast<float>(std::cos(angle));
    const float s = static_cast<float>(std::sin(angle));
    // Interleaved pairs (2i, 2i+1) for llama2.c; rotate-half pairs (i, i+d/2) for HF.
    float* a = style_ == RopeStyle::kInterleaved ? vec + 2 * i : vec + i;
    float* b = style_ == RopeStyle::kInterleaved ? vec + 2 * i + 1 : vec + i + half;
    const float x0 = *a, x1 = *b;
    *a = x0 * c - x1 * s;
    *b = x0 * s + x1 * c;
  }
}

void RopeTable::RotateHeads(float* row, int n_heads, int64_t position) const {
  for (int h = 0; h < n_heads; ++h) Rotate(row + static_cast<size_t>(h) * head_dim_, position);
}

}  // namespace lazykv::cpu
