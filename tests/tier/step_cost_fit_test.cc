// The step fit's prefill rate against the rate that generated the steps, on steps where
// prefill and decoding grow together (a fit on prefill alone reads the rate far too high
// there: checked, so the data is the hard case), and the cost model's use of it around a
// calibration.
#include "worker/tier/step_cost_fit.h"

#include <gtest/gtest.h>

#include <random>

#include "tests/test_util.h"
#include "worker/tier/fetch_cost_model.h"

namespace lazykv {
namespace {

struct TrueCosts {
  double base, per_prefill, per_row, per_kv;
  double Seconds(const StepShape& s) const {
    return base + per_prefill * s.prefill_tokens + per_row * s.decode_rows + per_kv * s.decode_kv_tokens;
  }
};

// Busy steps carry more prefill and more decoding at once (a burst of arrivals).
StepShape ConfoundedStep(std::mt19937_64& rng) {
  const int load = static_cast<int>(rng() % 64);
  StepShape s;
  s.decode_rows = load + static_cast<int>(rng() % 8);
  s.prefill_tokens = load * 8 + static_cast<int>(rng() % 128);
  s.decode_kv_tokens = static_cast<int64_t>(s.decode_rows) * (2000 + static_cast<int>(rng() % 3000));
  return s;
}

TEST(StepCostFitTest, TellsPrefillApartFromDecodingThatGrowsWithIt) {
  std::mt19937_64 rng(testing::FreshSeed());
  const TrueCosts truth{0.004 + (rng() % 100) * 1e-5, 20e-6 + (rng() % 10) * 1e-6, 60e-6 + (rng() % 40) * 1e-6,
                        1e-8 * (5 + rng() % 10)};
  StepCostFit fit(0.98);
  DecayingLinearFit prefill_only(0.98);
  std::normal_distribution<double> noise(0.0, 0.005);
  for (int i = 0; i < 400; ++i) {
    const StepShape s = ConfoundedStep(rng);
    const double seconds = truth.Seconds(s) * (1 + noise(rng));
    fit.Add(s, seconds);
    prefill_only.Add(s.prefill_tokens, seconds);
  }
  ASSERT_TRUE(fit.PrefillSecondsPerToken().has_value());
  EXPECT_NEAR(*fit.PrefillSecondsPerToken(), truth.per_prefill, 0.1 * truth.per_prefill);
  // The hard case indeed: prefill alone is off by more than half.
  EXPECT_GT(prefill_only.slope(), 1.5 * truth.per_prefill);
}

TEST(StepCostFitTest, ExactDataIsRecoveredExactlyAndDecodeOnlyStepsAreAllowed) {
  std::mt19937_64 rng(testing::FreshSeed());
  const TrueCosts truth{0.002, 24e-6, 50e-6, 2e-8};
  StepCostFit fit(0.95);
  for (int i = 0; i < 100; ++i) {
    StepShape s = ConfoundedStep(rng);
    if (i % 3 == 0) s.prefill_tokens = 0;  // decode-only steps
    fit.Add(s, truth.Seconds(s));
  }
  ASSERT_TRUE(fit.PrefillSecondsPerToken().has_value());
  EXPECT_NEAR(*fit.PrefillSecondsPerToken(), truth.per_prefill, 1e-3 * truth.per_prefill);
}

// Decoding rows that make steps faster (no such cost is non-negative): the full fit is
// refused and the best fit without that term gives the prefill rate.
TEST(StepCostFitTest, AnInfeasibleTermIsDroppedAndThePrefillRateStillFound) {
  std::mt19937_64 rng(testing::FreshSeed());
  StepCostFit fit(0.98);
  for (int i = 0; i < 300; ++i) {
    const StepShape s{static_cast<int>(rng() % 1024), static_cast<int>(rng() % 64), static_cast<int64_t>(rng() % 100000)};
    fit.Add(s, 0.02 + 25e-6 * s.prefill_tokens - 50e-6 * s.decode_rows + 1e-8 * s.decode_kv_tokens);
  }
  ASSERT_TRUE(fit.PrefillSecondsPerToken().has_value());
  EXPECT_NEAR(*fit.PrefillSecondsPerToken(), 25e-6, 2.5e-6);
}

TEST(StepCostFitTest, UnidentifiedOrNegativeRatesAreUnknown) {
  StepCostFit constant(0.95);  // every step the same prefill: its cost cannot be told from the base
  for (int i = 0; i < 50; ++i) constant.Add(StepShape{512, i % 7, 1000 * (i % 5)}, 0.01 + 1e-4 * (i % 7));
  EXPECT_FALSE(constant.PrefillSecondsPerToken().has_value());
  StepCostFit empty(0.95);
  EXPECT_FALSE(empty.PrefillSecondsPerToken().has_value());
  StepCostFit falling(0.95);  // more prefill, faster steps: no non-negative rate explains it
  for (int i = 0; i < 50; ++i) falling.Add(StepShape{(i % 10) * 100, 0, 0}, 0.1 - 1e-5 * (i % 10) * 100);
  EXPECT_FALSE(falling.PrefillSecondsPerToken().has_value());
}

TEST(FetchCostModelTest, ACalibrationAnchorsThePrefillCostWithinAFactorOfTwo) {
  std::mt19937_64 rng(testing::FreshSeed());
  const double calibrated = 20e-6 + (rng() % 10) * 1e-6;
  // Uncalibrated: the steps' fit alone.
  FetchCostModel fitted_only;
  const TrueCosts truth{0.003, calibrated, 80e-6, 1e-8};
  for (int i = 0; i < 64; ++i) {
    const StepShape s = ConfoundedStep(rng);
    fitted_only.RecordStep(s, truth.Seconds(s));
  }
  EXPECT_NEAR(fitted_only.PrefillSecondsPerToken(), calibrated, 1e-3 * calibrated);
  EXPECT_EQ(fitted_only.CalibratedSecondsPerToken(), 0);

  // Calibrated, before any step: the calibration.
  FetchCostModel model;
  model.CalibratePrefill(512, 512 * calibrated);
  model.CalibratePrefill(0, 1.0);     // ignored
  model.CalibratePrefill(512, -1.0);  // ignored
  EXPECT_NEAR(model.PrefillSecondsPerToken(), calibrated, 1e-12);
  EXPECT_NEAR(*model.ComputeSeconds(512), 512 * calibrated, 1e-12);
  // Steps that say 4x the calibration: held at 2x.
  const TrueCosts slow{0.003, 4 * calibrated, 80e-6, 1e-8};
  for (int i = 0; i < 64; ++i) {
    const StepShape s = ConfoundedStep(rng);
    model.RecordStep(s, slow.Seconds(s));
  }
  EXPECT_NEAR(model.FittedSecondsPerToken(), 4 * calibrated, 1e-3 * calibrated);
  EXPECT_NEAR(model.PrefillSecondsPerToken(), 2 * calibrated, 1e-12);
  // Steps at 1.5x: taken as they are.
  const TrueCosts warmer{0.003, 1.5 * calibrated, 80e-6, 1e-8};
  for (int i = 0; i < 400; ++i) {
    const StepShape s = ConfoundedStep(rng);
    model.RecordStep(s, warmer.Seconds(s));
  }
  EXPECT_NEAR(model.PrefillSecondsPerToken(), 1.5 * calibrated, 0.01 * calibrated);
  // And the decision follows: a source that takes 0.6x the recompute wins, 1.1x loses.
  model.RecordFetch("host", 64 << 20, 0.6 * 512 * 1.5 * calibrated);
  EXPECT_EQ(model.Decide("host", 64 << 20, 512), FetchCostModel::Choice::kFetch);
  model.RecordFetch("disk", 64 << 20, 1.1 * 512 * 1.5 * calibrated);
  EXPECT_EQ(model.Decide("disk", 64 << 20, 512), FetchCostModel::Choice::kRecompute);
}

}  // namespace
}  // namespace lazykv

namespace lazykv {
namespace {

// A fetch slower than computing the chunk alone, but sooner than the prefill queued ahead
// of a chunk computed now: fetched.
TEST(FetchCostModelTest, QueuedPrefillCountsAgainstRecomputing) {
  std::mt19937_64 rng(testing::FreshSeed());
  const double per_token = 20e-6 + (rng() % 10) * 1e-6;
  FetchCostModel model(FetchCostOptions{.decay = 0.9, .explore_every = 0});
  model.CalibratePrefill(512, 512 * per_token);
  const double fetch = 3 * 512 * per_token;  // three times the chunk's own compute
  model.RecordFetch("remote", 64 << 20, fetch);
  EXPECT_EQ(model.Decide("remote", 64 << 20, 512, 0), FetchCostModel::Choice::kRecompute);
  EXPECT_EQ(model.Decide("remote", 64 << 20, 512, 512), FetchCostModel::Choice::kRecompute);  // 2x: still slower
  EXPECT_EQ(model.Decide("remote", 64 << 20, 512, 4 * 512), FetchCostModel::Choice::kFetch);   // 5x
  EXPECT_EQ(model.Decide("remote", 64 << 20, 512, -100), FetchCostModel::Choice::kRecompute);  // nonsense: none
}

}  // namespace
}  // namespace lazykv
