// Chunk-shared decode attention: the launcher (shared_decode_attention.h), the residual launch of
// the per-sequence split kernel, and the combine of every partial state of a (sequence, head).
#include <algorithm>
#include <array>
#include <atomic>

#include "kernels/cuda/lazy_decode_kernels.cuh"
#include "kernels/cuda/shared_decode_attention.h"
#include "kernels/cuda/shared_decode_kernel.cuh"
#include "kernels/cuda/softmax_merge.cuh"
#include "kernels/cuda/split_combine.h"

namespace lazykv::cuda {
namespace {

constexpr int kStages = 4;  // K+V tiles of 32 tokens in flight per CTA, less one
// The residual kernel: the per-sequence kernel's 4 warps, but 2 stages (69 KB of shared memory
// a CTA instead of 100), so that its CTAs find room beside the shared kernel's: 104.1-104.3
// against 105.8-106.6 us at batch 64, 78.4-78.5 against 81.4-82.6 at batch 32 (H100,
// bench/results/shared_decode_2026-11-28.md, call 5).
constexpr int kResidualWarps = 4, kResidualStages = 2;
constexpr int kMaxDevices = 64;
constexpr int kCombineWarps = 4;
constexpr int kCombineBatch = 16;  // states whose accumulators a lane loads at once

// Raises a kernel's dynamic shared-memory limit once per device (what the launch needs).
template <typename Kernel>
void AllowSmem(Kernel* kernel, size_t bytes, std::array<std::atomic<bool>, kMaxDevices>& done) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) device = 0;
  if (done[device].load(std::memory_order_relaxed)) return;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)) ==
      cudaSuccess) {
    done[device].store(true, std::memory_order_relaxed);
  }
}

template <int HD, int MIN_CTAS, int PRECISION>
void LaunchSharedWith(const SharedDecodeParams& p, int group, cudaStream_t stream) {
  using Shape = shared_decode::SharedShape<HD, kStages>;
  static std::array<std::atomic<bool>, kMaxDevices> done{};
  auto* kernel = &shared_decode::SharedDecodeKernel<HD, kStages, MIN_CTAS, PRECISION>;
  AllowSmem(kernel, Shape::kSmemBytes, done);
  const unsigned ctas = static_cast<unsigned>(p.num_items) * p.base.kv.n_kv_heads;
  kernel<<<ctas, shared_decode::kSThreads, Shape::kSmemBytes, stream>>>(p, group);
}

// The variants (shared_decode_attention.h; the kernel's template parameters): CTAs per SM the
// registers must allow and what reaches the tensor cores; and the largest error against the
// per-sequence kernel (relative to the largest output) that the variant's arithmetic allows.
struct SharedVariant {
  void (*launch)(const SharedDecodeParams&, int, cudaStream_t);
  void (*launch64)(const SharedDecodeParams&, int, cudaStream_t);
  const char* name;
  double tolerance;
};
template <int MIN_CTAS, int PRECISION>
constexpr SharedVariant Variant(const char* name, double tolerance) {
  return {&LaunchSharedWith<128, MIN_CTAS, PRECISION>, &LaunchSharedWith<64, MIN_CTAS, PRECISION>, name, tolerance};
}
// Measured on the H100 (bench/results/shared_decode_2026-11-28.md), batch 64 on the issue's
// trace, the residual kernel beside: the query and P each rounded once to bf16 (as the lazy
// prefill kernel and FlashAttention do) leave 32 registers free, so 3 CTAs fit an SM: 105.9
// against 126.2 us with the hi + lo pairs. Its error against the per-sequence kernel: 1.8e-3 of
// the largest output in the bench, up to 6.4e-3 over cuda_shared_decode_test's fresh random
// batches (within one bf16 step, 2^-8 to 2^-7 of the value). The tolerance allows two steps at
// the top of a binade (1.6e-2): the query's rounding moves each score by up to 2^-9 of
// sum |q_i k_i|, which the softmax turns into relative changes of the weights of that order,
// and P's own rounding adds 2^-9 a weight; a wrong rotation, member or block shows as O(1).
// The hi + lo pairs (~1e-5, held to 1e-4, which one bf16 rounding anywhere would fail; at most
// 2 CTAs an SM without spilling) stay for comparison and LAZYKV_SHARED_DECODE_EXACT=1.
constexpr SharedVariant kVariants[kSharedKernelVariants] = {
    Variant<3, shared_decode::kQpBf16>("3 CTAs/SM, Q and P bf16", 1.6e-2),
    Variant<2, shared_decode::kQpHiLo>("2 CTAs/SM, Q and P bf16 hi + lo", 1e-4),
    Variant<2, shared_decode::kQpBf16>("2 CTAs/SM, Q and P bf16", 1.6e-2),
    Variant<2, shared_decode::kPBf16>("2 CTAs/SM, Q bf16 hi + lo, P bf16", 1.6e-2),
};

void LaunchShared(const SharedDecodeParams& p, int group, cudaStream_t stream) {
  const SharedVariant& v =
      kVariants[p.kernel_variant >= 0 && p.kernel_variant < kSharedKernelVariants ? p.kernel_variant : 0];
  (p.base.kv.head_dim == 64 ? v.launch64 : v.launch)(p, group, stream);
}

template <int HD, int GP>
void LaunchResidualFor(const DecodeAttentionParams& r, int splits, int entries_per_split, cudaStream_t stream) {
  using Shape = DecodeShape<HD, GP, kResidualWarps, kResidualStages>;
  static std::array<std::atomic<bool>, kMaxDevices> done{};
  auto* kernel = &DecodeSplitKernel<HD, GP, kResidualWarps, kResidualStages>;
  AllowSmem(kernel, Shape::kSmemBytes, done);
  const unsigned ctas = static_cast<unsigned>(r.num_seqs) * splits * r.kv.n_kv_heads;
  kernel<<<ctas, kResidualWarps * 32, Shape::kSmemBytes, stream>>>(r, splits, entries_per_split);
}

template <int HD>
void LaunchResidualHd(const DecodeAttentionParams& r, int group, int splits, int eps, cudaStream_t stream) {
  if (group <= 1) return LaunchResidualFor<HD, 1>(r, splits, eps, stream);
  if (group <= 2) return LaunchResidualFor<HD, 2>(r, splits, eps, stream);
  if (group <= 4) return LaunchResidualFor<HD, 4>(r, splits, eps, stream);
  return LaunchResidualFor<HD, 8>(r, splits, eps, stream);
}

// One warp per (sequence, head) pair: merges the pair's shared parts (shared_parts[seq] of
// max_parts slots) and its residual splits (all res_splits of them; an empty one has l = 0).
// State j (shared parts first, then residual splits) is read by lane j % 32 for its max and
// weight; the weights are broadcast and every lane sums its dimensions over the states in
// order. The accumulators are loaded kBatch states at a time before they are summed, the first
// batch before the maxima are known, so a pair of at most kBatch states (the usual: a few
// documents' parts and two residual splits) waits on memory about once, not once per state.
template <int kBatch>
__global__ void __launch_bounds__(kCombineWarps * 32)
    SharedCombineKernel(const float* shared_ws, const float* residual_ws, const int32_t* shared_parts, float* out,
                        int pairs, int n_heads, int max_parts, int res_splits, int hd) {
  constexpr unsigned kAll = 0xffffffffu;
  constexpr int kMaxPerLane = 128 / 32;
  const int pair = blockIdx.x * kCombineWarps + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (pair >= pairs) return;
  const int parts = shared_parts[pair / n_heads], states = parts + res_splits;
  const SplitPartials<const float> s = SplitPartialsIn(shared_ws, static_cast<size_t>(pairs), max_parts);
  const SplitPartials<const float> r = SplitPartialsIn(residual_ws, static_cast<size_t>(pairs), res_splits);
  const size_t s0 = SplitStateIndex(pair, 0, max_parts), r0 = SplitStateIndex(pair, 0, res_splits);
  // State j's max, sum and accumulator.
  const auto m_of = [&](int j) { return j < parts ? s.m + s0 + j : r.m + r0 + (j - parts); };
  const auto l_of = [&](int j) { return j < parts ? s.l[s0 + j] : r.l[r0 + (j - parts)]; };
  const auto acc_of = [&](int j) { return j < parts ? s.acc + (s0 + j) * hd : r.acc + (r0 + j - parts) * hd; };
  // States [first, first + kBatch): this lane's dimensions of each (an empty state's values are
  // loaded but never used: its weight is 0).
  float v[kBatch][kMaxPerLane];
  const auto load_batch = [&](int first) {
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      if (first + b < states) {
        const float* a = acc_of(first + b);
#pragma unroll
        for (int k = 0; k < kMaxPerLane; ++k) v[b][k] = lane + 32 * k < hd ? a[lane + 32 * k] : 0.0f;
      }
    }
  };
  load_batch(0);
  float m = -INFINITY;
  for (int j = lane; j < states; j += 32) m = MergeMax(m, m_of(j), l_of(j));
#pragma unroll
  for (int mask = 16; mask > 0; mask /= 2) m = fmaxf(m, __shfl_xor_sync(kAll, m, mask));
  float acc[kMaxPerLane] = {0.0f, 0.0f, 0.0f, 0.0f}, l = 0.0f;
  static_assert(32 % kBatch == 0, "a batch lies within one round of 32 weights");
  float w = 0.0f;
  for (int first = 0; first < states; first += kBatch) {
    if (first % 32 == 0) {  // the weights of states [first, first + 32), one a lane
      const int j = first + lane;
      w = 0.0f;
      if (j < states) {
        const float lj = l_of(j);
        w = MergeWeight(m_of(j), lj, m);
        l += w * lj;
      }
    }
    if (first > 0) load_batch(first);
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const float wi = __shfl_sync(kAll, w, (first + b) % 32);
      if (first + b < states) {
#pragma unroll
        for (int k = 0; k < kMaxPerLane; ++k) acc[k] += lane + 32 * k < hd && wi > 0.0f ? wi * v[b][k] : 0.0f;
      }
    }
  }
#pragma unroll
  for (int mask = 16; mask > 0; mask /= 2) l += __shfl_xor_sync(kAll, l, mask);
#pragma unroll
  for (int k = 0; k < kMaxPerLane; ++k) {
    if (lane + 32 * k < hd) out[static_cast<size_t>(pair) * hd + lane + 32 * k] = MergedOutput(acc[k], l);
  }
}

size_t SharedWorkspaceFloats(const SharedDecodeParams& p) {
  return SplitWorkspaceBytes(static_cast<size_t>(p.base.num_seqs) * p.base.n_heads, p.max_shared_parts,
                             p.base.kv.head_dim) /
         sizeof(float);
}

}  // namespace

double SharedKernelVariantTolerance(int variant) {
  return kVariants[variant >= 0 && variant < kSharedKernelVariants ? variant : 0].tolerance;
}

const char* SharedKernelVariantName(int variant) {
  return kVariants[variant >= 0 && variant < kSharedKernelVariants ? variant : 0].name;
}

SharedDecodePlanOptions SharedDecodeOptionsFor(int n_heads, int n_kv_heads, int block_size) {
  // Measured at batch 32/64/128 (bench/results/shared_decode_2026-11-25.md): items of a whole
  // 512-token document beat 256 (fewer CTAs, prologues and partial states). Solo items were 4%
  // faster at batch 64 and within noise at 32 and 128, but were not measured where little is
  // shared (most of the KV would then go through the shared kernel, built for many rows): off.
  const int group = n_kv_heads > 0 ? std::max(1, n_heads / n_kv_heads) : 1;
  SharedDecodePlanOptions o;
  o.max_members = std::max(3, std::min(16, kSharedMaxRows / group));
  o.max_entries_per_item = std::clamp(512 / std::max(1, block_size), 1, kSharedMaxEntries);
  o.solo_items = false;
  return o;
}

int SharedResidualSplits(const SharedDecodeParams& p) {
  if (p.max_residual_entries <= 0) return 0;
  if (p.residual_splits > 0) return std::max(2, std::min(p.residual_splits, 1024));
  // As the per-sequence kernel would split the residual table, but at least 2: with one split
  // that kernel writes its normalized output, not the partial state the combine needs.
  DecodeAttentionParams r = p.base;
  r.max_entries_per_seq = p.max_residual_entries;
  r.num_splits = 0;
  return std::max(2, ChooseDecodeSplits(r));
}

size_t SharedDecodeWorkspaceBytes(const SharedDecodeParams& p) {
  return SharedWorkspaceFloats(p) * sizeof(float) +
         SplitWorkspaceBytes(static_cast<size_t>(p.base.num_seqs) * p.base.n_heads, SharedResidualSplits(p),
                             p.base.kv.head_dim);
}

cudaError_t LaunchSharedDecodeAttention(const SharedDecodeParams& p, cudaStream_t stream) {
  const DecodeAttentionParams& b = p.base;
  const int group = b.kv.n_kv_heads > 0 ? b.n_heads / b.kv.n_kv_heads : 0;
  if (b.num_seqs <= 0 || b.kv.n_kv_heads <= 0 || b.n_heads % b.kv.n_kv_heads != 0 || group < 1 || group > kMaxGroup ||
      (b.kv.head_dim != 64 && b.kv.head_dim != 128) || b.kv.block_size <= 0 || b.kv.element != Element::kBf16 ||
      p.workspace == nullptr || b.out == nullptr || p.num_items < 0 ||
      (p.num_items > 0 && (p.items == nullptr || p.members == nullptr || p.max_shared_parts <= 0)) ||
      p.shared_parts == nullptr || p.res_offsets == nullptr) {
    return cudaErrorInvalidValue;
  }
  const int res_splits = SharedResidualSplits(p);
  // The residual kernel beside the shared one: forked after what the stream ran before (the
  // queries and the new keys), joined before the combine.
  const bool beside =
      p.residual_stream != nullptr && p.fork != nullptr && p.join != nullptr && res_splits > 0 && p.num_items > 0;
  cudaStream_t residual_stream = stream;
  if (beside) {
    if (cudaError_t e = cudaEventRecord(p.fork, stream); e != cudaSuccess) return e;
    if (cudaError_t e = cudaStreamWaitEvent(p.residual_stream, p.fork); e != cudaSuccess) return e;
    residual_stream = p.residual_stream;
  }
  if (p.num_items > 0) LaunchShared(p, group, stream);
  float* residual_ws = p.workspace + SharedWorkspaceFloats(p);
  if (res_splits > 0) {
    DecodeAttentionParams r = b;
    r.new_tokens = {};  // the KV write ran before: the residual kernel only reads
    r.kv.block_ids = p.res_block_ids;
    r.kv.block_tokens = p.res_block_tokens;
    r.kv.block_deltas = p.res_block_deltas;
    r.kv.block_starts = p.res_block_starts;
    r.kv.table_offsets = p.res_offsets;
    r.max_entries_per_seq = p.max_residual_entries;
    r.workspace = residual_ws;
    const int eps = std::max(1, (p.max_residual_entries + res_splits - 1) / res_splits);
    if (b.kv.head_dim == 64) {
      LaunchResidualHd<64>(r, group, res_splits, eps, residual_stream);
    } else {
      LaunchResidualHd<128>(r, group, res_splits, eps, residual_stream);
    }
  }
  if (beside) {  // joined whatever the launches reported: nothing may run on after the step
    if (cudaError_t e = cudaEventRecord(p.join, p.residual_stream); e != cudaSuccess) return e;
    if (cudaError_t e = cudaStreamWaitEvent(stream, p.join); e != cudaSuccess) return e;
  }
  const int pairs = b.num_seqs * b.n_heads;
  SharedCombineKernel<kCombineBatch><<<(pairs + kCombineWarps - 1) / kCombineWarps, kCombineWarps * 32, 0, stream>>>(
      p.workspace, residual_ws, p.shared_parts, b.out, pairs, b.n_heads, p.max_shared_parts, res_splits, b.kv.head_dim);
  return cudaGetLastError();
}

}  // namespace lazykv::cuda
