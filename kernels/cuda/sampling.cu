#include <climits>
#include <cmath>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/sampling.h"

namespace lazykv::cuda {
namespace {

using u64 = unsigned long long;

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kBins = 256;
constexpr unsigned kFull = 0xffffffffu;
// Radix digits of p's bits, most significant first: the exponent (the sign bit is always 0),
// then the mantissa in 8, 8 and 7 bits.
__constant__ int kShift[4] = {23, 15, 7, 0};
__constant__ uint32_t kDigitMask[4] = {0xFF, 0xFF, 0xFF, 0x7F};

struct ArgMax {
  float value;
  int index;
};

struct ArgMaxOp {
  __device__ ArgMax operator()(const ArgMax& a, const ArgMax& b) const {
    if (a.value > b.value) return a;
    if (b.value > a.value) return b;
    return a.index < b.index ? a : b;
  }
};

struct Shared {
  union {
    cub::BlockReduce<ArgMax, kThreads>::TempStorage argmax;
    cub::BlockReduce<double, kThreads>::TempStorage dsum;
    cub::BlockReduce<u64, kThreads>::TempStorage usum;
    cub::BlockScan<int, kThreads>::TempStorage scan;
  } cub;
  u64 hist[kWarps][kBins];  // one histogram per warp: atomics collide only within a warp
  float max_logit;
  int argmax;
  double log_z;
  u64 total;
  uint32_t digit;
  u64 above;
  int found;
};

__device__ __forceinline__ u64 Mass(float p, double scale) { return __double2ull_rn(static_cast<double>(p) * scale); }

struct Crossing {
  int index;
  u64 cumulative;  // the running mass up to and including the token
};

// The first token in the order (p decreasing, ties by id) whose running mass exceeds
// `threshold` (strict) or reaches it; the caller guarantees that one does.
__device__ Crossing FindCrossing(const float* probs, int vocab, u64 threshold, bool strict, double scale, Shared& sh) {
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  uint32_t prefix = 0, mask = 0;
  u64 above = 0;  // mass of the tokens before every token matching the prefix
  for (int pass = 0; pass < 4; ++pass) {
    const int shift = kShift[pass];
    const uint32_t digit_mask = kDigitMask[pass];
    for (int b = tid; b < kWarps * kBins; b += kThreads) (&sh.hist[0][0])[b] = 0;
    __syncthreads();
    for (int i = tid; i < vocab; i += kThreads) {
      const float p = probs[i];
      const uint32_t key = __float_as_uint(p);
      if ((key & mask) == prefix) atomicAdd(&sh.hist[warp][(key >> shift) & digit_mask], Mass(p, scale));
    }
    __syncthreads();
    if (tid < kBins) {
      u64 s = 0;
      for (int w = 0; w < kWarps; ++w) s += sh.hist[w][tid];
      sh.hist[0][tid] = s;
    }
    __syncthreads();
    if (warp == 0) {
      // Lane l holds digits 255 - 8l down to 248 - 8l: the digits in decreasing order.
      u64 local[8], lane_sum = 0;
      for (int j = 0; j < 8; ++j) lane_sum += local[j] = sh.hist[0][kBins - 1 - (lane * 8 + j)];
      u64 inclusive = lane_sum;
      for (int o = 1; o < 32; o <<= 1) {
        const u64 n = __shfl_up_sync(kFull, inclusive, o);
        if (lane >= o) inclusive += n;
      }
      u64 run = above + inclusive - lane_sum;
      int hit = -1;
      u64 before = 0;
      for (int j = 0; j < 8; ++j) {
        const u64 next = run + local[j];
        if (hit < 0 && (strict ? next > threshold : next >= threshold)) {
          hit = j;
          before = run;
        }
        run = next;
      }
      const unsigned ballot = __ballot_sync(kFull, hit >= 0);
      if (ballot == 0 && lane == 31) {  // out of range (rounding): the last digit
        sh.digit = 0;
        sh.above = run - local[7];
      } else if (ballot != 0 && lane == __ffs(ballot) - 1) {
        sh.digit = kBins - 1 - (lane * 8 + hit);
        sh.above = before;
      }
    }
    __syncthreads();
    prefix |= sh.digit << shift;
    mask |= digit_mask << shift;
    above = sh.above;
  }
  // Every token with these bits has the same mass m: the crossing is the j-th of them by id.
  const u64 m = Mass(__uint_as_float(prefix), scale);
  u64 j = 0;
  if (m > 0 && threshold >= above) {
    const u64 gap = threshold - above;
    j = strict ? gap / m : (gap > 0 ? (gap + m - 1) / m - 1 : 0);
  }
  const int per = (vocab + kThreads - 1) / kThreads;
  const int begin = min(vocab, tid * per), end = min(vocab, begin + per);
  int count = 0;
  for (int i = begin; i < end; ++i) count += __float_as_uint(probs[i]) == prefix;
  int before_me = 0, ties = 0;
  cub::BlockScan<int, kThreads>(sh.cub.scan).ExclusiveSum(count, before_me, ties);
  const int want = static_cast<int>(min(j, static_cast<u64>(max(ties, 1) - 1)));
  if (want >= before_me && want < before_me + count) {
    int k = want - before_me;
    for (int i = begin; i < end; ++i) {
      if (__float_as_uint(probs[i]) == prefix && k-- == 0) {
        sh.found = i;
        break;
      }
    }
  }
  __syncthreads();
  return Crossing{sh.found, above + static_cast<u64>(want + 1) * m};
}

// Greedy rows over many CTAs: each slice of a row's logits leaves its first maximum and the
// sum of exp(l - its maximum) (in double), and the row's CTA merges the slices.
struct GreedySlice {
  double exp_sum;
  float max_logit;
  int argmax;
};
constexpr int kSliceThreads = 256;
constexpr int kMinSliceIds = 2048;  // ids per slice, at least
constexpr int kMaxSlices = 64;

__host__ __device__ inline int GreedySlices(int vocab) {
  const int slices = vocab / kMinSliceIds;
  return slices < 1 ? 1 : slices > kMaxSlices ? kMaxSlices : slices;
}

// Grid (slices, rows). Rows with a temperature are left to SampleRowsKernel.
__global__ void __launch_bounds__(kSliceThreads) GreedySliceKernel(SampleParams params) {
  using Reduce = cub::BlockReduce<ArgMax, kSliceThreads>;
  using SumReduce = cub::BlockReduce<double, kSliceThreads>;
  __shared__ union {
    typename Reduce::TempStorage argmax;
    typename SumReduce::TempStorage sum;
  } tmp;
  __shared__ float slice_max;
  __shared__ int slice_argmax;
  AllowDependentLaunch();
  WaitForPriorGrid();
  const SampleRowParams row = params.rows[blockIdx.y];
  if (row.temperature != 0.0f) return;  // the CTA alike
  const int vocab = params.vocab, slices = gridDim.x, tid = threadIdx.x;
  const int span = (vocab + slices - 1) / slices;
  const int begin = min(vocab, static_cast<int>(blockIdx.x) * span), end = min(vocab, begin + span);
  const float* logits = params.logits + static_cast<size_t>(row.logits_row) * vocab;
  ArgMax best{-INFINITY, INT_MAX};
  for (int i = begin + tid; i < end; i += kSliceThreads) {  // ids rise within a thread
    const float v = logits[i];
    if (v > best.value || best.index == INT_MAX) best = ArgMax{v, i};
  }
  best = Reduce(tmp.argmax).Reduce(best, ArgMaxOp());
  if (tid == 0) {
    slice_max = best.value;
    slice_argmax = best.index;
  }
  __syncthreads();
  const float m = slice_max;
  double sum = 0;
  if (m != -INFINITY) {  // else every logit of the slice is -inf: it adds nothing
    for (int i = begin + tid; i < end; i += kSliceThreads) {
      sum += exp(static_cast<double>(logits[i]) - static_cast<double>(m));
    }
  }
  sum = SumReduce(tmp.sum).Sum(sum);
  if (tid == 0) {
    reinterpret_cast<GreedySlice*>(params.greedy_slices)[static_cast<size_t>(blockIdx.y) * slices + blockIdx.x] =
        GreedySlice{sum, m, slice_argmax};
  }
}

// The row's token and log-probability from its slices (the CTA of SampleRowsKernel).
__device__ void MergeGreedySlices(const SampleParams& params, const float* logits, Shared& sh) {
  const int slices = GreedySlices(params.vocab), tid = threadIdx.x;
  const GreedySlice* row_slices =
      reinterpret_cast<const GreedySlice*>(params.greedy_slices) + static_cast<size_t>(blockIdx.x) * slices;
  GreedySlice mine{0.0, -INFINITY, INT_MAX};
  if (tid < slices) mine = row_slices[tid];
  // Slices hold rising ids: the first maximum over them is the first maximal logit.
  const ArgMax best =
      cub::BlockReduce<ArgMax, kThreads>(sh.cub.argmax).Reduce(ArgMax{mine.max_logit, mine.argmax}, ArgMaxOp());
  if (tid == 0) {
    sh.max_logit = best.value;
    sh.argmax = best.index;
  }
  __syncthreads();
  const double m = sh.max_logit;
  // A slice of -inf adds nothing; a NaN in a slice makes the sum NaN, as on the one-CTA path.
  const double part = mine.max_logit == -INFINITY ? 0.0 : mine.exp_sum * exp(static_cast<double>(mine.max_logit) - m);
  const double sum = cub::BlockReduce<double, kThreads>(sh.cub.dsum).Sum(part);
  if (tid == 0) {
    const int id = sh.argmax;
    params.out[blockIdx.x] = SampledRow{id, static_cast<float>(static_cast<double>(logits[id]) - (m + log(sum)))};
  }
}

__global__ void __launch_bounds__(kThreads) SampleRowsKernel(SampleParams params, double scale) {
  extern __shared__ __align__(16) unsigned char smem[];
  Shared& sh = *reinterpret_cast<Shared*>(smem);
  WaitForPriorGrid();  // launched by LaunchDependent: the logits (and slices) are written
  const SampleRowParams row = params.rows[blockIdx.x];
  const int vocab = params.vocab, tid = threadIdx.x;
  const float* logits = params.logits + static_cast<size_t>(row.logits_row) * vocab;
  if (row.temperature == 0.0f && params.greedy_slices != nullptr && GreedySlices(vocab) > 1) {
    MergeGreedySlices(params, logits, sh);
    return;
  }
  float* probs = params.workspace + static_cast<size_t>(blockIdx.x) * vocab;

  // Strided ids rise within a thread, so keeping the first maximum keeps the lowest id.
  ArgMax best{-INFINITY, INT_MAX};
  for (int i = tid; i < vocab; i += kThreads) {
    const float v = logits[i];
    if (v > best.value || best.index == INT_MAX) best = ArgMax{v, i};
  }
  best = cub::BlockReduce<ArgMax, kThreads>(sh.cub.argmax).Reduce(best, ArgMaxOp());
  if (tid == 0) {
    sh.max_logit = best.value;
    sh.argmax = best.index;
  }
  __syncthreads();
  const float max_logit = sh.max_logit;
  const bool greedy = row.temperature == 0.0f;

  // The host's float arithmetic exactly: (l - max) and its quotient rounded to fp32 (the
  // library compiles with fast math, hence the intrinsics).
  double exp_sum = 0;
  u64 mass_sum = 0;
  for (int i = tid; i < vocab; i += kThreads) {
    const float d = __fsub_rn(logits[i], max_logit);
    const double e = exp(static_cast<double>(d));
    exp_sum += e;
    if (!greedy) {
      const double tempered = row.temperature == 1.0f ? e : exp(static_cast<double>(__fdiv_rn(d, row.temperature)));
      const float p = static_cast<float>(tempered);
      probs[i] = p;
      mass_sum += Mass(p, scale);
    }
  }
  exp_sum = cub::BlockReduce<double, kThreads>(sh.cub.dsum).Sum(exp_sum);
  if (tid == 0) sh.log_z = static_cast<double>(max_logit) + log(exp_sum);
  __syncthreads();
  const double log_z = sh.log_z;
  if (greedy) {
    if (tid == 0) {
      params.out[blockIdx.x] =
          SampledRow{sh.argmax, static_cast<float>(static_cast<double>(logits[sh.argmax]) - log_z)};
    }
    return;
  }
  mass_sum = cub::BlockReduce<u64, kThreads>(sh.cub.usum).Sum(mass_sum);
  if (tid == 0) sh.total = mass_sum;
  __syncthreads();
  const u64 total = sh.total;  // > 0: the maximal token has p = 1
  u64 kept = total;
  if (row.top_p < 1.0f) {
    const u64 threshold = static_cast<u64>(ceil(static_cast<double>(row.top_p) * static_cast<double>(total)));
    if (threshold < total) kept = FindCrossing(probs, vocab, max(threshold, 1ull), false, scale, sh).cumulative;
  }
  const u64 target = min(static_cast<u64>(row.uniform * static_cast<double>(kept)), kept - 1);
  const int id = FindCrossing(probs, vocab, target, true, scale, sh).index;
  if (tid == 0) params.out[blockIdx.x] = SampledRow{id, static_cast<float>(static_cast<double>(logits[id]) - log_z)};
}

}  // namespace

size_t SampleWorkspaceBytes(int num_rows, int vocab) {
  return static_cast<size_t>(num_rows > 0 ? num_rows : 0) * (vocab > 0 ? vocab : 0) * sizeof(float);
}

size_t SampleGreedySlicesBytes(int num_rows, int vocab) {
  return static_cast<size_t>(num_rows > 0 ? num_rows : 0) * GreedySlices(vocab > 0 ? vocab : 1) * sizeof(GreedySlice);
}

cudaError_t LaunchSampleRows(const SampleParams& p, cudaStream_t stream) {
  if (p.num_rows == 0) return cudaSuccess;
  if (p.num_rows < 0 || p.vocab <= 0 || p.vocab > (1 << 24) || p.logits == nullptr || p.rows == nullptr ||
      p.workspace == nullptr || p.out == nullptr) {
    return cudaErrorInvalidValue;
  }
  int bits = 0;  // bits of vocab: masses of p <= 1 in 2^(62 - bits) units sum below 2^62
  while ((1 << bits) <= p.vocab) ++bits;
  const double scale = ldexp(1.0, 62 - bits);
  const size_t smem = sizeof(Shared);
  if (cudaError_t e =
          cudaFuncSetAttribute(SampleRowsKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
      e != cudaSuccess) {
    return e;
  }
  const int slices = GreedySlices(p.vocab);
  if (p.greedy_slices != nullptr && slices > 1) {
    if (cudaError_t e = LaunchDependent(GreedySliceKernel, dim3(slices, p.num_rows), kSliceThreads, 0, stream, p);
        e != cudaSuccess) {
      return e;
    }
  }
  return LaunchDependent(SampleRowsKernel, p.num_rows, kThreads, smem, stream, p, scale);
}

}  // namespace lazykv::cuda
