// The combine of split-KV partials (split_combine.h), shared by the decode and prefill
// launchers: per (query row, head) pair, the splits' maxima are reduced, each split's weight is
// formed once in shared memory, then each thread sums its dimensions over the splits with
// independent loads (four accumulators). A small launch of the warp shape instead loads every
// split's partial for its dimensions before the weights are formed (WarpPairSums).
#include <climits>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/softmax_merge.cuh"
#include "kernels/cuda/split_combine.h"

namespace lazykv::cuda {
namespace {

constexpr int kCombineThreads = 128;

// The max or the sum of v over the kPairThreads threads of a pair: one warp, or the CTA
// (through scratch, kCombineThreads / 32 floats).
template <int kPairThreads>
__device__ __forceinline__ float PairReduce(float v, float* scratch, bool is_max) {
#pragma unroll
  for (int mask = 16; mask > 0; mask /= 2) {
    const float o = __shfl_xor_sync(0xffffffffu, v, mask);
    v = is_max ? fmaxf(v, o) : v + o;
  }
  if constexpr (kPairThreads == 32) {
    return v;
  } else {
    static_assert(kPairThreads == kCombineThreads, "a pair is one warp or the whole CTA");
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    __syncthreads();  // scratch may still be read from a previous reduction
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = scratch[0];
    for (int w = 1; w < kCombineThreads / 32; ++w) v = is_max ? fmaxf(v, scratch[w]) : v + scratch[w];
    return v;
  }
}

// A warp's weighted sums over the splits for kWidth dimensions a lane (head_dim = 32 *
// kWidth), every split's partial loaded before the first is added (one round trip to L2 for a
// pair, where a loop over the dimensions waited on one group of four splits after another:
// 9 us a layer for a 16-token question, bench/results/mma_tail_2026-11-28.md). The sums run
// in the general loop's order (four accumulators by split modulo 4), so the output is the
// same bit for bit. REQUIRES splits <= kMaxRegSplits.
constexpr int kMaxRegSplits = 16;

template <int kWidth>
struct Lanes {
  float v[kWidth];
};

template <int kWidth>
__device__ __forceinline__ Lanes<kWidth> LoadLanes(const float* p) {
  Lanes<kWidth> r;
  if constexpr (kWidth == 4) {
    const float4 x = *reinterpret_cast<const float4*>(p);
    r.v[0] = x.x, r.v[1] = x.y, r.v[2] = x.z, r.v[3] = x.w;
  } else {
    static_assert(kWidth == 2, "head dims 128 and 64");
    const float2 x = *reinterpret_cast<const float2*>(p);
    r.v[0] = x.x, r.v[1] = x.y;
  }
  return r;
}

// Starts the loads (before the weights are formed); Finish adds and writes.
template <int kWidth>
struct WarpPairSums {
  Lanes<kWidth> acc[kMaxRegSplits];

  __device__ __forceinline__ void Load(const float* pair_acc, int splits, int lane) {
#pragma unroll
    for (int s = 0; s < kMaxRegSplits; ++s) {
      if (s < splits) acc[s] = LoadLanes<kWidth>(pair_acc + static_cast<size_t>(s) * 32 * kWidth + lane * kWidth);
    }
  }

  __device__ __forceinline__ void Finish(const float* weight, int splits, float l_all, float* out, int lane) const {
#pragma unroll
    for (int e = 0; e < kWidth; ++e) {
      float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
#pragma unroll
      for (int s = 0; s < kMaxRegSplits; s += 4) {
        if (s + 4 <= splits) {
          a0 += weight[s] * acc[s].v[e];
          a1 += weight[s + 1] * acc[s + 1].v[e];
          a2 += weight[s + 2] * acc[s + 2].v[e];
          a3 += weight[s + 3] * acc[s + 3].v[e];
        }
      }
#pragma unroll
      for (int s = 0; s < kMaxRegSplits; ++s) {
        if (s >= splits / 4 * 4 && s < splits) a0 += weight[s] * acc[s].v[e];
      }
      out[lane * kWidth + e] = MergedOutput((a0 + a1) + (a2 + a3), l_all);
    }
  }
};

// No partials held in registers (kRegWidth 0).
struct NoPairSums {};

// Grid: x = kCombineThreads / kPairThreads pairs of a group per CTA, y = the group. Dynamic
// shared memory: per pair of the CTA, its splits' weights (splits rounded up to a multiple of
// 4: the compiler may read the tail of the unrolled loop as one vector). kRegWidth 0: the loop
// over the dimensions; 2 or 4 (a warp a pair, head_dim 32 * kRegWidth, at most kMaxRegSplits
// splits, 16-byte aligned partials): WarpPairSums, whose registers cost occupancy, so the
// launcher takes it only where the grid fits the SMs anyway.
template <int kPairThreads, int kRegWidth>
__global__ void __launch_bounds__(kCombineThreads) SplitCombineKernel(SplitCombineParams p) {
  static_assert(kRegWidth == 0 || kPairThreads == 32, "registers for a warp's pair");
  constexpr int kPairsPerCta = kCombineThreads / kPairThreads;
  AllowDependentLaunch();
  WaitForPriorGrid();
  extern __shared__ float weights[];
  __shared__ float scratch[kCombineThreads / 32];
  const int splits = p.splits, hd = p.head_dim;
  const int local = kPairsPerCta == 1 ? 0 : threadIdx.x / kPairThreads;  // the pair within the CTA
  const int t = kPairsPerCta == 1 ? threadIdx.x : threadIdx.x % kPairThreads;
  const int flat = blockIdx.x * kPairsPerCta + local;
  const int row = flat / p.n_heads, head = flat % p.n_heads;
  int row0 = 0, rows = p.max_rows;
  if (p.row_offsets != nullptr) {
    row0 = p.row_offsets[blockIdx.y];
    rows = p.row_offsets[blockIdx.y + 1] - row0;
  }
  if (row >= rows) return;  // every thread of the pair alike (the CTA, or a warp)
  float* weight = weights + local * ((splits + 3) / 4 * 4);
  const size_t pair = static_cast<size_t>(row0 + row) * p.n_heads + head;
  const SplitPartials<const float> part = SplitPartialsIn(p.workspace, p.pairs, splits);
  const size_t base = SplitStateIndex(pair, 0, splits);
  [[maybe_unused]] std::conditional_t<kRegWidth != 0, WarpPairSums<kRegWidth>, NoPairSums> sums;
  if constexpr (kRegWidth != 0) sums.Load(part.acc + base * hd, splits, t);  // before the weights
  float m_local = -INFINITY;
  for (int s = t; s < splits; s += kPairThreads) {
    const float l = part.l[base + s];
    weight[s] = l;
    m_local = MergeMax(m_local, part.m + base + s, l);
  }
  const float m_all = PairReduce<kPairThreads>(m_local, scratch, true);
  float l_local = 0.0f;
  for (int s = t; s < splits; s += kPairThreads) {
    const float l = weight[s];
    const float w = MergeWeight(part.m + base + s, l, m_all);
    weight[s] = w;
    l_local += w * l;
  }
  const float l_all = PairReduce<kPairThreads>(l_local, scratch, false);  // a CTA's barriers publish weight[]
  if constexpr (kPairThreads == 32) __syncwarp();                         // a warp's weight[]
  if constexpr (kRegWidth != 0) {
    sums.Finish(weight, splits, l_all, p.out + pair * hd, t);
  } else {
    for (int d = t; d < hd; d += kPairThreads) {
      const float* acc = part.acc + base * hd + d;
      float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
      int s = 0;
      for (; s + 4 <= splits; s += 4) {
        a0 += weight[s] * acc[static_cast<size_t>(s) * hd];
        a1 += weight[s + 1] * acc[static_cast<size_t>(s + 1) * hd];
        a2 += weight[s + 2] * acc[static_cast<size_t>(s + 2) * hd];
        a3 += weight[s + 3] * acc[static_cast<size_t>(s + 3) * hd];
      }
      for (; s < splits; ++s) a0 += weight[s] * acc[static_cast<size_t>(s) * hd];
      p.out[pair * hd + d] = MergedOutput((a0 + a1) + (a2 + a3), l_all);
    }
  }
}

}  // namespace

cudaError_t LaunchSplitCombine(const SplitCombineParams& p, SplitCombineShape shape, cudaStream_t stream) {
  const long long pairs_per_group = static_cast<long long>(p.max_rows) * p.n_heads;
  if (p.workspace == nullptr || p.out == nullptr || p.splits < 1 || p.n_heads <= 0 || p.head_dim <= 0 ||
      p.max_rows < 0 || pairs_per_group > INT_MAX || p.groups < 1 || p.groups > 65535 ||
      (p.row_offsets == nullptr && p.groups != 1)) {
    return cudaErrorInvalidValue;
  }
  if (pairs_per_group > 0) {
    const size_t weight_bytes = static_cast<size_t>((p.splits + 3) / 4) * 4 * sizeof(float);
    if (shape == SplitCombineShape::kCtaPerPair) {
      const dim3 grid(static_cast<unsigned>(pairs_per_group), p.groups);
      return LaunchDependent(SplitCombineKernel<kCombineThreads, 0>, grid, kCombineThreads, weight_bytes, stream, p);
    } else {
      constexpr int kPairsPerCta = kCombineThreads / 32;
      const dim3 grid(static_cast<unsigned>((pairs_per_group + kPairsPerCta - 1) / kPairsPerCta), p.groups);
      const size_t smem = kPairsPerCta * weight_bytes;
      // The partials in registers where they fit and the grid is at most one wave at the
      // kernel's lower occupancy (4 CTAs an SM at its ~120 registers: a question's combine).
      const uintptr_t acc = reinterpret_cast<uintptr_t>(SplitPartialsIn(p.workspace, p.pairs, p.splits).acc);
      const bool in_registers = p.splits <= kMaxRegSplits && acc % 16 == 0 &&
                                static_cast<long long>(grid.x) * grid.y <= 4LL * MultiprocessorCount();
      if (in_registers && p.head_dim == 128) {
        return LaunchDependent(SplitCombineKernel<32, 4>, grid, kCombineThreads, smem, stream, p);
      }
      if (in_registers && p.head_dim == 64) {
        return LaunchDependent(SplitCombineKernel<32, 2>, grid, kCombineThreads, smem, stream, p);
      }
      return LaunchDependent(SplitCombineKernel<32, 0>, grid, kCombineThreads, smem, stream, p);
    }
  }
  return cudaGetLastError();
}

}  // namespace lazykv::cuda
