// The combine of split-KV partials (kernels/cuda/split_combine.h), warp-per-pair shape, on fresh
// random states (empty splits and an all-empty pair included) against a plain merge in double
// written here, and its two ways of summing bit for bit alike: every split's partials in
// registers (a launch of at most a wave, 16-byte aligned partials, at most 16 splits) and the
// loop over the dimensions (a larger launch, or misaligned partials). A sum in another order,
// a split left out or a weight applied to the wrong split fails one or the other.
#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/split_combine.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/test_util.h"

namespace lazykv::testing {
namespace {

struct CombineShape {
  int head_dim, splits, n_heads;
};

// The merged output of pair `pair` (split_combine.h's layout), in double.
std::vector<double> MergeOnHost(const std::vector<float>& ws, size_t pairs, int splits, int hd, size_t pair) {
  const float* m = ws.data();
  const float* l = m + pairs * splits;
  const float* acc = l + pairs * splits;
  double top = -INFINITY;
  for (int s = 0; s < splits; ++s) {
    if (l[pair * splits + s] > 0) top = std::max(top, static_cast<double>(m[pair * splits + s]));
  }
  std::vector<double> out(hd, 0.0);
  double sum = 0;
  for (int s = 0; s < splits; ++s) {
    const size_t i = pair * splits + s;
    if (!(l[i] > 0)) continue;
    const double w = std::exp2(m[i] - top);
    sum += w * l[i];
    for (int d = 0; d < hd; ++d) out[d] += w * acc[i * hd + d];
  }
  for (double& v : out) v = sum > 0 ? v / sum : 0.0;
  return out;
}

TEST(CudaSplitCombineTest, WarpPathsAgreeBitForBitAndWithAPlainMerge) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uniform(-6.0f, 6.0f);
  // A 16-token question's shape (16 splits, 32 heads), then odd split counts and head dim 64.
  for (const CombineShape& shape : {CombineShape{128, 16, 32}, CombineShape{128, 5, 8}, CombineShape{64, 16, 16},
                                    CombineShape{64, 3, 4}, CombineShape{128, 1, 8}}) {
    SCOPED_TRACE(::testing::Message() << "head dim " << shape.head_dim << ", " << shape.splits << " splits, "
                                      << shape.n_heads << " heads");
    const int hd = shape.head_dim, splits = shape.splits;
    // Rows enough that a launch over all of them is more than a wave at 4 CTAs (of 4 pairs)
    // an SM (the loop over dimensions); the first kSmallRows of them make a launch of at most
    // a wave (registers).
    constexpr int kSmallRows = 16;
    int sms = 0;
    CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const int rows = 16 * sms / shape.n_heads + kSmallRows + 1;
    const size_t pairs = static_cast<size_t>(rows) * shape.n_heads;
    std::vector<float> ws(pairs * splits * (hd + 2));
    float* m = ws.data();
    float* l = m + pairs * splits;
    float* acc = l + pairs * splits;
    for (size_t i = 0; i < pairs * splits; ++i) {
      m[i] = uniform(rng);
      l[i] = rng() % 5 == 0 ? 0.0f : 0.1f + 3.0f * std::fabs(normal(rng));  // some splits saw no key
      for (int d = 0; d < hd; ++d) acc[i * hd + d] = normal(rng);
    }
    for (int s = 0; s < splits; ++s) l[3 * splits + s] = 0.0f;  // pair 3: every split empty

    DeviceArena arena;
    // The states twice: 16-byte aligned (cudaMalloc's), and one float further (misaligned).
    float* aligned = arena.Alloc<float>(ws.size());
    float* shifted = arena.Alloc<float>(ws.size() + 1) + 1;
    CUDA_OK(cudaMemcpy(aligned, ws.data(), ws.size() * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(shifted, ws.data(), ws.size() * sizeof(float), cudaMemcpyHostToDevice));

    auto combine = [&](const float* workspace, int rows) -> std::vector<float> {
      const size_t n = static_cast<size_t>(rows) * shape.n_heads * hd;
      float* out = arena.Alloc<float>(n);
      EXPECT_EQ(cudaMemset(out, 0xff, n * sizeof(float)), cudaSuccess);  // NaN: an unwritten element fails
      cuda::SplitCombineParams p;
      p.workspace = workspace;
      p.out = out;
      p.pairs = pairs;
      p.splits = splits;
      p.n_heads = shape.n_heads;
      p.head_dim = hd;
      p.max_rows = rows;
      EXPECT_EQ(cuda::LaunchSplitCombine(p, cuda::SplitCombineShape::kWarpPerPair, nullptr), cudaSuccess);
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      return ToHost(out, n);
    };
    const std::vector<float> in_registers = combine(aligned, kSmallRows);
    std::vector<float> large_launch = combine(aligned, rows);
    large_launch.resize(in_registers.size());  // the small launch's rows
    const std::vector<float> misaligned = combine(shifted, kSmallRows);
    ASSERT_EQ(std::memcmp(in_registers.data(), large_launch.data(), in_registers.size() * sizeof(float)), 0)
        << "a small launch (registers) and a large one (the loop over dimensions)";
    ASSERT_EQ(std::memcmp(in_registers.data(), misaligned.data(), in_registers.size() * sizeof(float)), 0)
        << "aligned partials (registers) and misaligned ones (the loop over dimensions)";
    int bad = 0;
    for (size_t pair = 0; pair < static_cast<size_t>(kSmallRows) * shape.n_heads; ++pair) {
      const std::vector<double> want = MergeOnHost(ws, pairs, splits, hd, pair);
      for (int d = 0; d < hd; ++d) {
        const double got = in_registers[pair * hd + d];
        if (!(std::fabs(got - want[d]) <= 1e-5 * (1.0 + std::fabs(want[d]))) && ++bad <= 5) {
          ADD_FAILURE() << "pair " << pair << ", dimension " << d << ": " << got << " against " << want[d];
        }
      }
    }
    EXPECT_EQ(bad, 0);
  }
}

}  // namespace
}  // namespace lazykv::testing
