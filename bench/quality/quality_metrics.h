// The output-quality harness's arithmetic (bench/quality/): log-probabilities from
// logits, perplexity, greedy agreement, relative error and confidence intervals. Pure
// functions over plain vectors, so that a test can check each against a hand computation.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace lazykv::quality {

// log softmax(logits)[token]: logits[token] - max - log(sum exp(logits - max)), the terms
// in fp32, the sum and the log in double.
double LogProbOf(std::span<const float> logits, int32_t token);

// The greedy choice: the first maximal logit (lowest id), as SampleRow picks it.
int32_t ArgMax(std::span<const float> logits);

// exp(mean NLL): the perplexity of a sequence whose per-token log-probabilities are given.
// Empty: 1 (nothing to predict).
double Perplexity(std::span<const double> logprobs);
// -mean(logprobs); empty: 0.
double MeanNll(std::span<const double> logprobs);

// Greedy agreement of `generated` with `reference`, over the reference's positions:
// `prefix` is the share of positions before the first difference (a generated sequence
// that ends early differs from there on), `overall` the share of positions i where
// generated[i] == reference[i]. An empty reference agrees fully (1, 1).
struct Agreement {
  double prefix = 1;
  double overall = 1;
  int first_divergence = 0;  // index of the first difference; reference.size() if none
};
Agreement GreedyAgreement(std::span<const int32_t> generated, std::span<const int32_t> reference);

// ||a - b|| / ||b|| (L2); vectors of different sizes: +infinity; b == 0: ||a - b||.
double RelativeL2Error(std::span<const float> a, std::span<const float> b);

// A mean and its 95% confidence interval.
struct Interval {
  double mean = 0;
  double low = 0;
  double high = 0;
  int n = 0;
};

// Percentile bootstrap of the mean (resamples cases with replacement; `resamples` draws
// from a generator seeded with `seed`, so a run is reproducible). Fewer than 2 values:
// low = high = mean.
Interval BootstrapMean(std::span<const double> values, int resamples = 2000, uint64_t seed = 1);
// Normal approximation: mean +- 1.96 * sd / sqrt(n) (sample sd, n - 1).
Interval NormalMean(std::span<const double> values);
// exp of BootstrapMean: for a geometric mean ratio from per-case log ratios.
Interval ExpInterval(const Interval& log_interval);

}  // namespace lazykv::quality
