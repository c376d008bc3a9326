// CPU reference kernels against their definitions: RoPE's group law and relative-position
// property, and lazy paged attention against dense attention over materialized keys.
#include <cmath>
#include <random>

#include "gtest/gtest.h"
#include "kernels/cpu/paged_attention.h"
#include "kernels/cpu/rope.h"
#include "tests/test_util.h"

namespace lazykv::cpu {
namespace {

std::vector<float> RandomVector(std::mt19937_64& rng, size_t n) {
  std::normal_distribution<float> dist;
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

RopeConfig Variant(int which) {
  RopeConfig rope;
  if (which >= 1) rope.style = RopeStyle::kRotateHalf;
  if (which == 2) {
    rope.theta = 500000;
    rope.llama3_scaling = true;
  }
  return rope;
}

TEST(RopeTest, RotationsComposeAndScoresDependOnlyOnRelativePosition) {
  const uint64_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> pos(0, 131072);
  for (int variant = 0; variant < 3; ++variant) {
    for (int head_dim : {64, 128}) {
      const RopeTable rope(Variant(variant), head_dim);
      for (int trial = 0; trial < 20; ++trial) {
        const int64_t a = pos(rng), b = pos(rng);
        auto x = RandomVector(rng, head_dim);
        auto composed = x, direct = x;
        rope.Rotate(composed.data(), a);
        rope.Rotate(composed.data(), b);
        rope.Rotate(direct.data(), a + b);
        EXPECT_LT(testing::RelativeError(composed, direct), 1e-5);

        auto q = RandomVector(rng, head_dim), k = RandomVector(rng, head_dim);
        auto qa = q, kb = k, q_rel = q;
        rope.Rotate(qa.data(), a);
        rope.Rotate(kb.data(), b);
        rope.Rotate(q_rel.data(), a - b);
        double absolute = 0, relative = 0, scale = 0;
        for (int d = 0; d < head_dim; ++d) {
          absolute += qa[d] * kb[d];
          relative += q_rel[d] * k[d];
          scale += std::abs(q[d] * k[d]);
        }
        EXPECT_LT(std::abs(absolute - relative) / scale, 1e-5);
      }
    }
  }
}

TEST(LazyPagedAttentionTest, EqualsDenseAttentionOverMaterializedKeys) {
  const uint64_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  for (int variant = 0; variant < 3; ++variant) {
    const int block_size = std::uniform_int_distribution<int>(1, 16)(rng);
    const int n_kv_heads = 2, n_heads = 6, head_dim = 16, num_blocks = 64;
    const RopeTable rope(Variant(variant), head_dim);
    const size_t width = n_kv_heads * head_dim;
    auto k_pool = RandomVector(rng, num_blocks * block_size * width);
    auto v_pool = RandomVector(rng, num_blocks * block_size * width);
    const KvLayerView kv{k_pool.data(), v_pool.data(), num_blocks, block_size, n_kv_heads, head_dim};

    // A block table of "chunks" placed with large deltas, partly filled blocks, and a
    // tail with delta 0; each physical block used once.
    std::vector<KvBlockRef> table;
    int32_t next_block = 0;
    for (int chunk = 0; chunk < 4; ++chunk) {
      const int32_t delta = std::uniform_int_distribution<int32_t>(0, 100000)(rng);
      const int blocks = std::uniform_int_distribution<int>(1, 3)(rng);
      for (int b = 0; b < blocks; ++b) {
        const int32_t fill = b + 1 < blocks ? block_size : std::uniform_int_distribution<int32_t>(1, block_size)(rng);
        table.push_back(KvBlockRef{next_block++, fill, chunk == 3 ? 0 : delta});
      }
    }
    int64_t total = 0;
    for (const auto& ref : table) total += ref.num_tokens;

    // Dense keys of the logical sequence: stored keys re-rotated by their block's delta.
    std::vector<std::vector<float>> keys, values;
    for (const auto& ref : table) {
      for (int s = 0; s < ref.num_tokens; ++s) {
        std::vector<float> k(k_pool.begin() + kv.slot_offset(ref.block, s),
                             k_pool.begin() + kv.slot_offset(ref.block, s) + width);
        rope.RotateHeads(k.data(), n_kv_heads, ref.delta);
        keys.push_back(k);
        values.emplace_back(v_pool.begin() + kv.slot_offset(ref.block, s),
                            v_pool.begin() + kv.slot_offset(ref.block, s) + width);
      }
    }
    const int n_queries = 5;
    std::vector<int32_t> positions;
    for (int i = 0; i < n_queries; ++i) positions.push_back(static_cast<int32_t>(total - n_queries + i));
    auto q = RandomVector(rng, n_queries * n_heads * head_dim);
    std::vector<float> out(q.size());
    LazyPagedAttention(q.data(), positions.data(), n_queries, n_heads, table, kv, rope, out.data());

    for (int t = 0; t < n_queries; ++t) {
      std::vector<float> expected(n_heads * head_dim, 0.0f);
      for (int h = 0; h < n_heads; ++h) {
        std::vector<float> qh(q.begin() + (t * n_heads + h) * head_dim, q.begin() + (t * n_heads + h + 1) * head_dim);
        rope.Rotate(qh.data(), positions[t]);
        const int kvh = h / (n_heads / n_kv_heads);
        std::vector<double> p(positions[t] + 1);
        double max_s = -INFINITY, sum = 0;
        for (int j = 0; j <= positions[t]; ++j) {
          double dot = 0;
          for (int d = 0; d < head_dim; ++d) dot += qh[d] * keys[j][kvh * head_dim + d];
          p[j] = dot / std::sqrt(double(head_dim));
          max_s = std::max(max_s, p[j]);
        }
        for (double& x : p) sum += x = std::exp(x - max_s);
        for (int j = 0; j <= positions[t]; ++j) {
          for (int d = 0; d < head_dim; ++d) expected[h * head_dim + d] += p[j] / sum * values[j][kvh * head_dim + d];
        }
      }
      const std::vector<float> got(out.begin() + t * n_heads * head_dim, out.begin() + (t + 1) * n_heads * head_dim);
      EXPECT_LT(testing::RelativeError(got, expected), 1e-4) << "variant " << variant << " query " << t;
    }

    // Materialize (the block baseline) writes exactly the re-rotated keys.
    const KvBlockRef src = table[0];
    CopyBlockRotated(kv, src.block, num_blocks - 1, 0, src.num_tokens, src.delta, rope);
    for (int s = 0; s < src.num_tokens; ++s) {
      const std::vector<float> copied(k_pool.begin() + kv.slot_offset(num_blocks - 1, s),
                                      k_pool.begin() + kv.slot_offset(num_blocks - 1, s) + width);
      EXPECT_LT(testing::RelativeError(copied, keys[s]), 1e-6);
    }
  }
}

}  // namespace
}  // namespace lazykv::cpu
