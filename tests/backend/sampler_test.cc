// The sampler against the distributions it should draw from.
#include "worker/backend/sampler.h"

#include <cmath>
#include <map>
#include <random>

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace lazykv {
namespace {

std::vector<float> LogitsOf(const std::vector<double>& probs) {
  std::vector<float> logits;
  for (double p : probs) logits.push_back(static_cast<float>(std::log(p)));
  return logits;
}

TEST(SamplerTest, GreedyPicksTheArgmaxWithItsLogprob) {
  const std::vector<float> logits = {0.1f, 2.5f, -1.0f, 2.4f};
  SamplerRng rng(1);
  const SampledToken t = SampleToken(logits, SamplingParams{}, rng);
  EXPECT_EQ(t.id, 1);
  double z = 0;
  for (float l : logits) z += std::exp(l);
  EXPECT_NEAR(t.logprob, 2.5 - std::log(z), 1e-6);
}

TEST(SamplerTest, TopPKeepsTheSmallestNucleusAndSamplesItsProportions) {
  const std::vector<double> probs = {0.15, 0.5, 0.05, 0.3};
  const auto logits = LogitsOf(probs);
  SamplerRng rng(testing::FreshSeed());
  const SamplingParams params{.max_tokens = 1, .temperature = 1.0f, .top_p = 0.75f, .seed = 0};
  std::map<int, int> counts;
  constexpr int kDraws = 40000;
  for (int i = 0; i < kDraws; ++i) ++counts[SampleToken(logits, params, rng).id];
  // Nucleus {1, 3} (0.5 < 0.75 <= 0.5 + 0.3), renormalized to 0.625 / 0.375.
  EXPECT_EQ(counts.size(), 2u);
  EXPECT_NEAR(counts[1] / double(kDraws), 0.625, 0.015);
  EXPECT_NEAR(counts[3] / double(kDraws), 0.375, 0.015);
}

TEST(SamplerTest, TemperatureSharpensAndFlattens) {
  const std::vector<double> probs = {0.6, 0.3, 0.1};
  const auto logits = LogitsOf(probs);
  SamplerRng rng(testing::FreshSeed());
  for (float temperature : {0.5f, 1.0f, 2.0f}) {
    std::vector<int> counts(3);
    constexpr int kDraws = 40000;
    const SamplingParams params{.max_tokens = 1, .temperature = temperature, .top_p = 1.0f, .seed = 0};
    for (int i = 0; i < kDraws; ++i) ++counts[SampleToken(logits, params, rng).id];
    double z = 0;
    for (double p : probs) z += std::pow(p, 1.0 / temperature);
    for (int i = 0; i < 3; ++i) {
      EXPECT_NEAR(counts[i] / double(kDraws), std::pow(probs[i], 1.0 / temperature) / z, 0.015)
          << "temperature " << temperature << " id " << i;
    }
  }
}

// The engine draws the uniform itself (NextRowSampling) and a backend samples the row: the
// same tokens as SampleToken with the request's generator, which greedy rows leave untouched.
TEST(SamplerTest, SampleTokenIsSampleRowWithTheNextUniform) {
  const uint64_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> logits(1000);
  for (float& l : logits) l = normal(gen);
  SamplerRng a(seed), b(seed);
  for (int i = 0; i < 200; ++i) {
    const SamplingParams params{.max_tokens = 1,
                                .temperature = i % 4 == 0 ? 0.0f : 0.5f * (i % 4),
                                .top_p = i % 3 == 0 ? 1.0f : 0.3f * (i % 3),
                                .seed = 0};
    const SampledToken want = SampleToken(logits, params, a);
    const RowSampling row = NextRowSampling(params, b);
    EXPECT_EQ(row.uniform == 0.0, params.temperature == 0.0f);
    const SampledToken got = SampleRow(logits, row);
    EXPECT_EQ(got.id, want.id);
    EXPECT_EQ(got.logprob, want.logprob);
  }
  EXPECT_EQ(a.NextUnit(), b.NextUnit());  // both drew exactly when the other did
}

TEST(SamplerTest, GreedyTiesGoToTheLowestId) {
  const std::vector<float> logits = {1.0f, 3.0f, -2.0f, 3.0f, 3.0f};
  EXPECT_EQ(SampleRow(logits, RowSampling{}).id, 1);
}

TEST(SamplerTest, RejectsBadParameters) {
  EXPECT_FALSE((SamplingParams{.max_tokens = -1}).Validate().ok());
  EXPECT_FALSE((SamplingParams{.temperature = NAN}).Validate().ok());
  EXPECT_FALSE((SamplingParams{.top_p = 1.5f}).Validate().ok());
  EXPECT_TRUE((SamplingParams{.max_tokens = 0, .temperature = 0.7f, .top_p = 0.5f}).Validate().ok());
}

}  // namespace
}  // namespace lazykv
