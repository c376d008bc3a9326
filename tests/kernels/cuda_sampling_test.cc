// The GPU sampling kernels (kernels/cuda/sampling.h) against the host sampler (SampleRow)
// on fresh random logits: odd vocabularies, 32000 and 128256; greedy, temperature with
// top_p 1, and small top_p where a few tokens qualify; rows with many exact ties. The GPU
// must pick the host's token for the same uniform. Where they differ, the difference must
// be explained by rounding: the host picks the GPU's token when its uniform (or top_p)
// moves by 1e-6, i.e. the host's running mass lands within 1e-6 of its target (the GPU's
// fixed-point masses are within ~1e-8 of the host's double sums, see sampling.h). Such
// rows are counted and must stay rare. Log-probabilities within 1e-4. Skips without a GPU.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>

#include "gtest/gtest.h"
#include "kernels/cuda/sampling.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/test_util.h"
#include "worker/backend/sampler.h"

namespace lazykv::testing {
namespace {

enum class Shape { kNormal, kWide, kTies, kPeaked, kFlat };

std::vector<float> RandomRow(std::mt19937_64& rng, int vocab, Shape shape) {
  std::normal_distribution<float> normal(0.0f, shape == Shape::kWide ? 4.0f : 1.5f);
  std::vector<float> row(vocab);
  for (float& l : row) l = normal(rng);
  if (shape == Shape::kTies) {
    for (float& l : row) l = std::round(l * 2.0f) / 2.0f;  // a handful of distinct values
  } else if (shape == Shape::kPeaked) {
    std::uniform_int_distribution<int> pick(0, vocab - 1);
    for (int k = 0; k < 3; ++k) row[pick(rng)] += 9.0f;  // top_p 0.1 keeps one or two tokens
  } else if (shape == Shape::kFlat) {
    std::fill(row.begin(), row.end(), 0.25f);
  }
  return row;
}

float HostLogprob(const std::vector<float>& logits, int id) {
  const float max_logit = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float l : logits) sum += std::exp(static_cast<double>(l - max_logit));
  return static_cast<float>(logits[id] - (max_logit + std::log(sum)));
}

bool ExplainedByRounding(const std::vector<float>& logits, const RowSampling& row, int gpu_id) {
  for (double du : {-1e-6, 1e-6}) {
    for (double dp : {-1e-6, 0.0, 1e-6}) {
      RowSampling moved = row;
      moved.uniform = std::clamp(row.uniform + du, 0.0, std::nextafter(1.0, 0.0));
      moved.top_p = static_cast<float>(std::clamp(row.top_p + dp, 1e-7, 1.0));
      if (SampleRow(logits, moved).id == gpu_id) return true;
    }
  }
  return false;
}

struct Outcome {
  int rows = 0, rounding = 0;
};

// Every row sampled on the GPU; with `slices`, greedy rows go over many CTAs
// (SampleParams::greedy_slices).
std::vector<cuda::SampledRow> SampleOnGpu(const std::vector<std::vector<float>>& logits,
                                          const std::vector<RowSampling>& sampling, bool slices,
                                          const std::string& what) {
  const int n = static_cast<int>(logits.size()), vocab = static_cast<int>(logits[0].size());
  std::vector<float> flat;
  std::vector<cuda::SampleRowParams> params;
  for (int r = 0; r < n; ++r) {
    flat.insert(flat.end(), logits[r].begin(), logits[r].end());
    params.push_back(cuda::SampleRowParams{.logits_row = r,
                                           .temperature = sampling[r].temperature,
                                           .top_p = sampling[r].top_p,
                                           .unused = 0,
                                           .uniform = sampling[r].uniform});
  }
  DeviceArena arena;
  cuda::SampleParams p{.logits = arena.Copy(flat),
                       .rows = arena.Copy(params),
                       .workspace = arena.Alloc<float>(static_cast<size_t>(n) * vocab),
                       .out = arena.Alloc<cuda::SampledRow>(n),
                       .num_rows = n,
                       .vocab = vocab,
                       .greedy_slices = slices ? arena.Alloc<char>(cuda::SampleGreedySlicesBytes(n, vocab)) : nullptr};
  EXPECT_EQ(cuda::LaunchSampleRows(p, nullptr), cudaSuccess) << what;
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
  return ToHost(p.out, n);
}

// Samples every row on the GPU and on the host; expects equal tokens (or a rounding case).
Outcome CheckRows(const std::vector<std::vector<float>>& logits, const std::vector<RowSampling>& sampling,
                  const std::string& what, bool slices = false, double logprob_tolerance = 1e-4) {
  const int n = static_cast<int>(logits.size()), vocab = static_cast<int>(logits[0].size());
  Outcome outcome;
  const std::vector<cuda::SampledRow> got = SampleOnGpu(logits, sampling, slices, what);
  for (int r = 0; r < n; ++r) {
    const SampledToken want = SampleRow(logits[r], sampling[r]);
    const RowSampling& s = sampling[r];
    SCOPED_TRACE(::testing::Message() << what << " row " << r << " temperature " << s.temperature << " top_p "
                                      << s.top_p << " uniform " << s.uniform);
    ++outcome.rows;
    if (got[r].id < 0 || got[r].id >= vocab) {
      ADD_FAILURE() << "token " << got[r].id << " outside the vocabulary";
      continue;
    }
    if (got[r].id != want.id) {
      ++outcome.rounding;
      EXPECT_NE(s.temperature, 0.0f) << "greedy picks exactly";
      EXPECT_TRUE(ExplainedByRounding(logits[r], s, got[r].id))
          << "GPU token " << got[r].id << ", host token " << want.id;
    }
    EXPECT_NEAR(got[r].logprob, HostLogprob(logits[r], got[r].id), logprob_tolerance);
  }
  return outcome;
}

// Greedy rows read in slices by many CTAs and merged: the host's token exactly (the first
// maximal logit, also when equal maxima sit in different slices or at a slice's edges, or
// whole slices are -inf), its log-probability within 1e-5; tempered rows of the same batch
// take the one-CTA path beside them.
TEST(CudaSamplingTest, GreedyRowsInSlicesPickTheFirstMaximum) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (int vocab : {4096, 4097, 32000, 128256, 131101}) {
    std::uniform_int_distribution<int> pick(0, vocab - 1);
    std::vector<std::vector<float>> logits;
    std::vector<RowSampling> sampling;
    auto add = [&](std::vector<float> row, float temperature) {
      logits.push_back(std::move(row));
      sampling.push_back(RowSampling{.temperature = temperature, .top_p = 0.9f, .uniform = unit(rng)});
    };
    for (Shape shape : {Shape::kNormal, Shape::kWide, Shape::kTies, Shape::kPeaked, Shape::kFlat}) {
      add(RandomRow(rng, vocab, shape), 0.0f);
      add(RandomRow(rng, vocab, shape), 0.8f);
    }
    // The same maximum planted at random ids, and at the first and last ids of the row.
    for (int k = 0; k < 4; ++k) {
      std::vector<float> row = RandomRow(rng, vocab, Shape::kNormal);
      const std::vector<int> ids = {pick(rng), pick(rng), pick(rng), k == 0 ? 0 : vocab - 1};
      for (int id : ids) row[id] = 20.0f;
      add(std::move(row), 0.0f);
    }
    // Whole stretches of -inf (masked tokens), the maximum in one short stretch.
    std::vector<float> masked(vocab, -INFINITY);
    const int from = pick(rng), to = std::min(vocab, from + 37);
    for (int i = from; i < to; ++i) masked[i] = static_cast<float>(unit(rng));
    add(std::move(masked), 0.0f);
    CheckRows(logits, sampling, "greedy in slices, vocab " + std::to_string(vocab), /*slices=*/true, 1e-5);

    // A NaN among the logits: a NaN log-probability, on both paths.
    std::vector<float> with_nan = RandomRow(rng, vocab, Shape::kNormal);
    with_nan[pick(rng)] = std::nanf("");
    for (bool slices : {false, true}) {
      const std::string what = "vocab " + std::to_string(vocab) + (slices ? ", slices" : ", one CTA");
      EXPECT_TRUE(std::isnan(SampleOnGpu({with_nan}, {RowSampling{}}, slices, what)[0].logprob)) << what;
    }
  }
}

TEST(CudaSamplingTest, PicksTheHostSamplersTokenForTheSameUniform) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  const std::vector<RowSampling> kinds = {
      RowSampling{.temperature = 0.0f, .top_p = 1.0f, .uniform = 0.0},
      RowSampling{.temperature = 1.0f, .top_p = 1.0f, .uniform = 0.0},
      RowSampling{.temperature = 0.7f, .top_p = 0.9f, .uniform = 0.0},
      RowSampling{.temperature = 1.3f, .top_p = 0.1f, .uniform = 0.0},
      RowSampling{.temperature = 1.0f, .top_p = 0.1f, .uniform = 0.0},
      RowSampling{.temperature = 0.5f, .top_p = 0.5f, .uniform = 0.0},
  };
  const std::vector<Shape> shapes = {Shape::kNormal, Shape::kWide, Shape::kTies, Shape::kPeaked, Shape::kFlat};
  Outcome total;
  for (int vocab : {1, 2, 7, 1023, 4097, 32000, 128256}) {
    std::vector<std::vector<float>> logits;
    std::vector<RowSampling> sampling;
    for (Shape shape : shapes) {
      for (RowSampling kind : kinds) {
        logits.push_back(RandomRow(rng, vocab, shape));
        kind.uniform = unit(rng);
        sampling.push_back(kind);
      }
    }
    // The ends of the unit interval.
    for (double u : {0.0, std::nextafter(1.0, 0.0)}) {
      logits.push_back(RandomRow(rng, vocab, Shape::kNormal));
      sampling.push_back(RowSampling{.temperature = 1.0f, .top_p = 1.0f, .uniform = u});
    }
    const Outcome o = CheckRows(logits, sampling, "vocab " + std::to_string(vocab));
    total.rows += o.rows;
    total.rounding += o.rounding;
  }
  std::printf("%d rows sampled on the GPU, %d differ from the host within rounding (1e-6 of the mass)\n", total.rows,
              total.rounding);
  // Flat rows at top_p 0.5 and an even vocabulary put the nucleus boundary exactly on
  // top_p, where the host's double sums and the GPU's exact ones may round either way.
  EXPECT_LE(total.rounding, std::max(4, total.rows / 50));
}

// Many draws from one row: the GPU's choices for fresh uniforms, all equal to the host's.
TEST(CudaSamplingTest, ManyUniformsOnOneRow) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  const std::vector<float> row = RandomRow(rng, 32000, Shape::kTies);
  std::vector<std::vector<float>> logits(256, row);
  std::vector<RowSampling> sampling;
  for (int i = 0; i < 256; ++i) {
    sampling.push_back(RowSampling{.temperature = 0.8f, .top_p = i % 2 == 0 ? 1.0f : 0.6f, .uniform = unit(rng)});
  }
  const Outcome o = CheckRows(logits, sampling, "one row");
  EXPECT_LE(o.rounding, 2);
}

// Not a check: how long a step's sampling takes at batch 64 of llama3-8b's vocabulary.
TEST(CudaSamplingTest, TimingAtBatch64) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  constexpr int kRows = 64, kVocab = 128256;
  std::mt19937_64 rng(7);
  std::vector<float> flat;
  for (int r = 0; r < kRows; ++r) {
    const std::vector<float> row = RandomRow(rng, kVocab, Shape::kNormal);
    flat.insert(flat.end(), row.begin(), row.end());
  }
  DeviceArena arena;
  for (const RowSampling kind : {RowSampling{.temperature = 0.0f, .top_p = 1.0f, .uniform = 0.0},
                                 RowSampling{.temperature = 1.0f, .top_p = 0.9f, .uniform = 0.5}}) {
    std::vector<cuda::SampleRowParams> params;
    for (int r = 0; r < kRows; ++r) {
      params.push_back(cuda::SampleRowParams{
          .logits_row = r, .temperature = kind.temperature, .top_p = kind.top_p, .unused = 0, .uniform = kind.uniform});
    }
    const cuda::SampleParams p{.logits = arena.Copy(flat),
                               .rows = arena.Copy(params),
                               .workspace = arena.Alloc<float>(static_cast<size_t>(kRows) * kVocab),
                               .out = arena.Alloc<cuda::SampledRow>(kRows),
                               .num_rows = kRows,
                               .vocab = kVocab};
    ASSERT_EQ(cuda::LaunchSampleRows(p, nullptr), cudaSuccess);
    CUDA_OK(cudaDeviceSynchronize());
    constexpr int kReps = 20;
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kReps; ++i) ASSERT_EQ(cuda::LaunchSampleRows(p, nullptr), cudaSuccess);
    CUDA_OK(cudaDeviceSynchronize());
    const double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() / kReps;
    std::printf("sampling %d rows of %d logits on the GPU (temperature %g, top_p %g): %.1f us per step\n", kRows,
                kVocab, kind.temperature, kind.top_p, us);
  }
}

}  // namespace
}  // namespace lazykv::testing
