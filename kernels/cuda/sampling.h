// Token sampling on the GPU, one CTA per row of logits, choosing what the host's SampleRow
// (worker/backend/sampler.h) chooses for the same uniform:
// - greedy (temperature 0): the first maximal logit (lowest id);
// - else the probabilities p = fp32(exp((l - max) / temperature)) taken in decreasing order,
//   ties by id, cut to the smallest prefix holding top_p of the mass, and the first token
//   whose running mass exceeds uniform * the kept mass.
// The host sorts; here that order is searched instead of built: a radix select over p's bits
// (exponent, then the mantissa in three digits), each pass a histogram of the mass per
// digit among the tokens that match the digits found so far, then the tied tokens by id.
// Masses are fixed-point integers (p * 2^(62 - bits(vocab)), rounded), so sums are exact in
// any order; they differ from the host's double sums by under vocab * 2^-(63 - bits(vocab))
// (about 1e-8 of the mass at vocab 128256), which changes the choice only where the host's
// running mass lands that close to its target. exp is evaluated in double and rounded to
// fp32 (the correctly rounded value, as glibc's expf gives it in all but rare cases).
// Each row also gets the chosen token's log-probability under the raw logits (log-sum-exp
// in double, as on the host).
// Greedy rows of a large vocabulary may instead be read by many CTAs (greedy_slices): each
// slice leaves its first maximum and its sum of exp(l - that maximum), and the row's CTA
// merges them. One CTA over Llama-3's 128256 logits took 42 us of a 6.2 ms batch-1 decode
// step on the H100; the slices take 12 us (bench/results/decode_step_2026-11-27.md).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace lazykv::cuda {

struct SampleRowParams {
  int32_t logits_row = 0;    // row of the logits matrix
  float temperature = 0.0f;  // 0: greedy
  float top_p = 1.0f;        // (0, 1]
  int32_t unused = 0;
  double uniform = 0.0;  // [0, 1), drawn on the host from the request's generator
};

struct SampledRow {
  int32_t id = 0;
  float logprob = 0.0f;
};

struct SampleParams {
  const float* logits = nullptr;          // [*][vocab]
  const SampleRowParams* rows = nullptr;  // [num_rows]
  float* workspace = nullptr;             // SampleWorkspaceBytes(num_rows, vocab)
  SampledRow* out = nullptr;              // [num_rows]
  int num_rows = 0;
  int vocab = 0;
  // SampleGreedySlicesBytes(num_rows, vocab), or null. Given, greedy rows of a large
  // vocabulary (4096 or more) are read by many CTAs, a slice each, then merged: the same
  // token, the log-probability's sum in another order.
  void* greedy_slices = nullptr;
};

size_t SampleWorkspaceBytes(int num_rows, int vocab);
size_t SampleGreedySlicesBytes(int num_rows, int vocab);

// vocab up to 2^24.
cudaError_t LaunchSampleRows(const SampleParams& p, cudaStream_t stream);

}  // namespace lazykv::cuda
