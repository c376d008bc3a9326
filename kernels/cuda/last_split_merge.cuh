// The last split merges (device code): split-KV without a combine kernel. Each CTA of a split
// writes its partial states (split_combine.h's layout) for a run of pairs, then counts itself
// in on a counter of those pairs; the CTA that completes the count merges every split's
// partials into the output and sets the counter back to zero. That saves the combine launch
// (3.2 us a layer in a batch-1 decode step: bench/results/cached_ttft_decode_2026-11-27.md)
// for a tail of reads from L2 in one CTA.
//
// The merge is the combine kernel's arithmetic (softmax_merge.cuh: the max over the non-empty
// splits, each split's weight formed once, the weighted sums), summed in another order, so
// within fp32 rounding of it, not bit for bit.
#pragma once

#include <cuda_runtime.h>

#include <cfloat>
#include <cstddef>
#include <cstdint>

#include "kernels/cuda/softmax_merge.cuh"

namespace lazykv::cuda {

namespace detail {

template <int kWidth>
__device__ __forceinline__ void LoadL2(const float* p, float (&v)[kWidth]) {
  if constexpr (kWidth == 4) {
    const float4 x = __ldcg(reinterpret_cast<const float4*>(p));
    v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
  } else {
    v[0] = __ldcg(p);
  }
}

// The weighted sums of MergeSplitsIfLast, kWidth dimensions a thread, two splits' loads per
// step unrolled twice (four in flight).
template <int kThreads, int kWidth>
__device__ __forceinline__ void MergeColumns(const SplitPartials<float>& part, const float* weights, const float* sums,
                                             int splits, size_t first_pair, int num_pairs, int head_dim, float* out) {
  const int columns = head_dim / kWidth;
  for (int c = threadIdx.x; c < num_pairs * columns; c += kThreads) {
    const int j = c / columns, d = (c % columns) * kWidth;
    const float* w = weights + static_cast<size_t>(j) * splits;
    const float* acc = part.acc + SplitStateIndex(first_pair + j, 0, splits) * head_dim + d;
    float a[kWidth] = {}, b[kWidth] = {};
    int s = 0;
#pragma unroll 2
    for (; s + 2 <= splits; s += 2) {
      float x[kWidth], y[kWidth];
      LoadL2<kWidth>(acc + static_cast<size_t>(s) * head_dim, x);
      LoadL2<kWidth>(acc + static_cast<size_t>(s + 1) * head_dim, y);
#pragma unroll
      for (int e = 0; e < kWidth; ++e) {
        a[e] = fmaf(w[s], x[e], a[e]);
        b[e] = fmaf(w[s + 1], y[e], b[e]);
      }
    }
    if (s < splits) {
      float x[kWidth];
      LoadL2<kWidth>(acc + static_cast<size_t>(s) * head_dim, x);
#pragma unroll
      for (int e = 0; e < kWidth; ++e) a[e] = fmaf(w[s], x[e], a[e]);
    }
    float* o = out + (first_pair + j) * head_dim + d;
#pragma unroll
    for (int e = 0; e < kWidth; ++e) o[e] = MergedOutput(a[e] + b[e], sums[j]);
  }
}

}  // namespace detail

// Floats of shared memory MergeSplitsIfLast needs as scratch: per pair, its splits' sums and
// maxima (then weights), and the merged sum.
__host__ __device__ constexpr size_t LastSplitMergeScratchFloats(int num_pairs, int splits) {
  return static_cast<size_t>(num_pairs) * (2 * splits + 1);
}

namespace detail {

// The merge's first pass, one warp per pair: each split's weight (the max over the non-empty
// splits first) into weights[pair][split] and the merged sum into sums[pair]. The partials'
// sums and maxima come from L2 (ld.cg: other SMs wrote them) in one round trip per 32 splits.
template <int kThreads>
__device__ __forceinline__ void SplitWeights(const SplitPartials<float>& part, int splits, size_t first_pair,
                                             int num_pairs, float* weights, float* maxima, float* sums) {
  constexpr int kWarps = kThreads / 32;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int j = warp; j < num_pairs; j += kWarps) {
    const size_t base = SplitStateIndex(first_pair + j, 0, splits);
    float* w = weights + static_cast<size_t>(j) * splits;
    float* ms = maxima + static_cast<size_t>(j) * splits;
    float m = -INFINITY;
    for (int s = lane; s < splits; s += 32) {
      const float l = __ldcg(part.l + base + s), m_s = __ldcg(part.m + base + s);
      w[s] = l;
      ms[s] = m_s;
      m = MergeMax(m, &m_s, l);
    }
#pragma unroll
    for (int mask = 16; mask > 0; mask /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, mask));
    float l_sum = 0.0f;
    for (int s = lane; s < splits; s += 32) {
      const float l = w[s];
      const float weight = MergeWeight(ms + s, l, m);
      w[s] = weight;
      l_sum += weight * l;
    }
#pragma unroll
    for (int mask = 16; mask > 0; mask /= 2) l_sum += __shfl_xor_sync(0xffffffffu, l_sum, mask);
    if (lane == 0) sums[j] = l_sum;
  }
}

}  // namespace detail

// Called by every thread of a CTA (kThreads of them) once it has stored its split's partial
// states for pairs [first_pair, first_pair + num_pairs) into `workspace` (capacity `pairs`
// pairs, `splits` splits). Exactly one CTA of the `splits` that share `counter` sees the count
// complete: it writes the merged output of those pairs ([pair][head_dim] fp32 at out) and
// resets the counter; the others return at once. Returns whether this CTA merged.
// REQUIRES: *counter is 0 before the first split counts in and no other launch uses it
// meanwhile; head_dim a multiple of 4; `scratch` holds LastSplitMergeScratchFloats floats of
// shared memory that no thread reads any more.
template <int kThreads>
__device__ bool MergeSplitsIfLast(float* workspace, size_t pairs, int splits, size_t first_pair, int num_pairs,
                                  int head_dim, float* out, int32_t* counter, float* scratch) {
  static_assert(kThreads % 32 == 0, "whole warps");
  // Release and acquire by one thread: the barrier orders the CTA's partial stores before
  // thread 0's fence, which is cumulative (as CUTLASS's split-K semaphore does it).
  __shared__ int is_last;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    const int before = atomicAdd(counter, 1);
    is_last = before == splits - 1;
    if (is_last) {
      atomicExch(counter, 0);  // every split has counted in: ready for the next launch
      __threadfence();         // the other splits' partials are read after their counts
    }
  }
  __syncthreads();
  if (!is_last) return false;

  const SplitPartials<float> part = SplitPartialsIn(workspace, pairs, splits);
  float* weights = scratch;
  float* maxima = scratch + static_cast<size_t>(num_pairs) * splits;
  float* sums = maxima + static_cast<size_t>(num_pairs) * splits;
  const int quads = head_dim / 4;
  const bool aligned = (reinterpret_cast<uintptr_t>(part.acc) | reinterpret_cast<uintptr_t>(out)) % 16 == 0;
  constexpr int kRegSplits = 16;
  if (aligned && splits <= kRegSplits && num_pairs * quads <= kThreads) {
    // The common case (a batch-1 decode: 16 splits, a KV group's 4 heads at head dim 128): one
    // thread per 4 dimensions of a pair, whose accumulators from every split are loaded into
    // registers before the weights are formed, so the merge waits on L2 about twice.
    const int c = threadIdx.x;
    const bool mine = c < num_pairs * quads;
    const int j = mine ? c / quads : 0, d = (c % quads) * 4;
    const float4* acc =
        reinterpret_cast<const float4*>(part.acc + SplitStateIndex(first_pair + j, 0, splits) * head_dim + d);
    float4 v[kRegSplits];
#pragma unroll
    for (int s = 0; s < kRegSplits; ++s) {
      if (mine && s < splits) v[s] = __ldcg(acc + static_cast<size_t>(s) * quads);
    }
    detail::SplitWeights<kThreads>(part, splits, first_pair, num_pairs, weights, maxima, sums);
    __syncthreads();
    if (mine) {
      const float* w = weights + static_cast<size_t>(j) * splits;
      float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
      for (int s = 0; s < kRegSplits; ++s) {
        if (s < splits) {
          a.x = fmaf(w[s], v[s].x, a.x);
          a.y = fmaf(w[s], v[s].y, a.y);
          a.z = fmaf(w[s], v[s].z, a.z);
          a.w = fmaf(w[s], v[s].w, a.w);
        }
      }
      const float l = sums[j];
      *reinterpret_cast<float4*>(out + (first_pair + j) * head_dim + d) =
          make_float4(MergedOutput(a.x, l), MergedOutput(a.y, l), MergedOutput(a.z, l), MergedOutput(a.w, l));
    }
    return true;
  }
  detail::SplitWeights<kThreads>(part, splits, first_pair, num_pairs, weights, maxima, sums);
  __syncthreads();
  // Per kWidth dimensions of a pair, one thread: the weighted sum over the splits (float4s
  // where the workspace's accumulators and the output are 16-byte aligned).
  if (aligned) {
    detail::MergeColumns<kThreads, 4>(part, weights, sums, splits, first_pair, num_pairs, head_dim, out);
  } else {
    detail::MergeColumns<kThreads, 1>(part, weights, sums, splits, first_pair, num_pairs, head_dim, out);
  }
  return true;
}

}  // namespace lazykv::cuda
