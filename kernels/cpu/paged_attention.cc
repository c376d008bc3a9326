#include "kernels/cpu/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace lazykv::cpu {

void LazyPagedAttention(const float* q, const int32_t* positions, int n_queries, int n_heads,
                        std::span<const KvBlockRef> context, const KvLayerView& kv, const RopeTable& rope, float* out) {
  const int hd = kv.head_dim;
  const int group = n_heads / kv.n_kv_heads;
  const size_t q_width = static_cast<size_t>(n_heads) * hd;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  int64_t total = 0;
  for (const KvBlockRef& ref : context) total += ref.num_tokens;

  std::vector<float> q_rotated(q_width);
  std::vector<float> scores;
  for (int t = 0; t < n_queries; ++t) {
    const int64_t position = positions[t];
    const int64_t visible = std::min<int64_t>(total, position + 1);
    scores.assign(static_cast<size_t>(n_heads) * visible, 0.0f);
    const float* q_raw = q + t * q_width;
    bool have_rotation = false;
    int32_t rotated_delta = 0;

    // Pass 1: scores, rotating the query whenever the delta changes.
    int64_t logical = 0;
    for (const KvBlockRef& ref : context) {
      if (logical >= visible) break;
      if (!have_rotation || ref.delta != rotated_delta) {
        std::memcpy(q_rotated.data(), q_raw, q_width * sizeof(float));
        rope.RotateHeads(q_rotated.data(), n_heads, position - ref.delta);
        rotated_delta = ref.delta;
        have_rotation = true;
      }
      const int64_t slots = std::min<int64_t>(ref.num_tokens, visible - logical);
      for (int64_t s = 0; s < slots; ++s) {
        const float* k_row = kv.k + kv.slot_offset(ref.block, static_cast<int32_t>(s));
        for (int h = 0; h < n_heads; ++h) {
          const float* qh = q_rotated.data() + static_cast<size_t>(h) * hd;
          const float* kh = k_row + static_cast<size_t>(h / group) * hd;
          float dot = 0;
          for (int d = 0; d < hd; ++d) dot += qh[d] * kh[d];
          scores[h * visible + logical + s] = dot * scale;
        }
      }
      logical += slots;
    }

    // Softmax per head.
    for (int h = 0; h < n_heads; ++h) {
      float* row = scores.data() + h * visible;
      float max_score = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < visible; ++j) max_score = std::max(max_score, row[j]);
      double sum = 0;
      for (int64_t j = 0; j < visible; ++j) {
        row[j] = std::exp(row[j] - max_score);
        sum += row[j];
      }
      const float inv = static_cast<float>(1.0 / sum);
      for (int64_t j = 0; j < visible; ++j) row[j] *= inv;
    }

    // Pass 2: weighted sum of values.
    float* o = out + t * q_width;
    std::fill(o, o + q_width, 0.0f);
    logical = 0;
    for (const KvBlockRef& ref : context) {
      if (logical >= visible) break;
      const int64_t slots = std::min<int64_t>(ref.num_tokens, visible - logical);
      for (int64_t s = 0; s < slots; ++s) {
        const float* v_row = kv.v + kv.slot_offset(ref.block, static_cast<int32_t>(s));
        for (int h = 0; h < n_heads; ++h) {
          const float p = scores[h * visible + logical + s];
          const float* vh = v_row + static_cast<size_t>(h / group) * hd;
          float* oh = o + static_cast<size_t>(h) * hd;
          for (int d = 0; d < hd; ++d) oh[d] += p * vh[d];
        }
      }
      logical += slots;
    }
  }
}

void CopyBlockRotated(const KvLayerView& kv, int32_t src_block, int32_t dst_block, int32_t first_slot,
                      int32_t end_slot, int32_t delta, const RopeTable& rope) {
  const size_t width = static_cast<size_t>(kv.n_kv_heads) * kv.head_dim;
  for (int32_t s = first_slot; s < end_slot; ++s) {
    float* k_dst = kv.k + kv.slot_offset(dst_block, s);
    std::memcpy(k_dst, kv.k + kv.slot_offset(src_block, s), width * sizeof(float));
    rope.RotateHeads(k_dst, kv.n_kv_heads, delta);
    std::memcpy(kv.v + kv.slot_offset(dst_block, s), kv.v + kv.slot_offset(src_block, s), width * sizeof(float));
  }
}

}  // namespace lazykv::cpu
