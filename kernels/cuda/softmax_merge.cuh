// Online-softmax states and their merge, in device code: the one building block behind every
// place that merges partial attention results (the decode kernel's warps, the combine of
// split-KV partials for decode and prefill alike: split_combine.h).
//
// A state of a set of scores s_k (log2 units: the score times log2(e) / sqrt(head_dim)) with
// values v_k is
//   m = max_k s_k,  l = sum_k 2^(s_k - m),  acc = sum_k 2^(s_k - m) v_k  (unnormalized);
// an empty set has l = 0, and its m and acc are never used. Merging states j gives
//   M = max of m_j over the non-empty j,  w_j = 2^(m_j - M) (0 for an empty state),
//   L = sum_j w_j l_j,  ACC = sum_j w_j acc_j,
// and the attention output ACC / L (0 when every state was empty). A merge runs in two
// passes, the max first (MergeMax), then the weighted sums (MergeWeight), so that each state
// is rescaled exactly once, whatever the number of states.
//
// The per-tile updates inside the attention kernels (a tile of fresh scores folded into a
// running state) are not merges of stored states and stay in each kernel's register layout.
#pragma once

#include <cuda_runtime.h>

#include <cfloat>
#include <cstddef>

namespace lazykv::cuda {

// The states live in memory (shared or global) when they are merged: m_j points at a state's
// max, which is read only when the state is not empty (l_j > 0).

// Pass 1: the merged max so far, m, with state (*m_j, l_j) taken in. Start from -INFINITY.
__device__ __forceinline__ float MergeMax(float m, const float* m_j, float l_j) {
  return l_j > 0.0f ? fmaxf(m, *m_j) : m;
}

// Pass 2: state (*m_j, l_j)'s weight in a merge whose max is m.
__device__ __forceinline__ float MergeWeight(const float* m_j, float l_j, float m) {
  return l_j > 0.0f ? exp2f(*m_j - m) : 0.0f;
}

// The attention output of a merged state.
__device__ __forceinline__ float MergedOutput(float acc, float l) { return l > 0.0f ? acc / l : 0.0f; }

// A merged state for one accumulator element.
struct MergedState {
  float m, l, acc;
};

// Merges N states: state j's (m, l) at m[j * stride], l[j * stride], the accumulator
// element at acc[j * acc_stride].
template <int N>
__device__ __forceinline__ MergedState MergeStates(const float* m, const float* l, const float* acc, int stride,
                                                   int acc_stride) {
  MergedState r{-INFINITY, 0.0f, 0.0f};
#pragma unroll
  for (int j = 0; j < N; ++j) r.m = MergeMax(r.m, m + j * stride, l[j * stride]);
#pragma unroll
  for (int j = 0; j < N; ++j) {
    const float w = MergeWeight(m + j * stride, l[j * stride], r.m);
    r.l += w * l[j * stride];
    r.acc += w * acc[j * acc_stride];
  }
  return r;
}

// Where split-KV partials keep their states in a float workspace (the layout of
// split_combine.h): for `pairs` (query row, head) pairs and `splits` splits, state
// (pair, split) is number i = pair * splits + split, its max at m[i], its sum at l[i] and its
// unnormalized output at acc[i * head_dim .. + head_dim). F: float for the attention kernels
// that write partials, const float for the combine that reads them.
template <typename F>
struct SplitPartials {
  F* m;
  F* l;
  F* acc;
};

template <typename F>
__host__ __device__ __forceinline__ SplitPartials<F> SplitPartialsIn(F* workspace, size_t pairs, int splits) {
  const size_t n = pairs * splits;
  return SplitPartials<F>{workspace, workspace + n, workspace + 2 * n};
}

__device__ __forceinline__ size_t SplitStateIndex(size_t pair, int split, int splits) { return pair * splits + split; }

}  // namespace lazykv::cuda
