// Lazy paged decode attention: kernel configurations, split choice and launch (the kernel is
// in lazy_decode_kernels.cuh, the combine of splits in split_combine.cu).
#include <algorithm>
#include <array>
#include <atomic>
#include <cfloat>

#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/last_split_merge.cuh"
#include "kernels/cuda/lazy_decode_attention.h"
#include "kernels/cuda/lazy_decode_attention_config.h"
#include "kernels/cuda/lazy_decode_kernels.cuh"
#include "kernels/cuda/split_combine.h"

namespace lazykv::cuda {
namespace {

constexpr int kMaxDevices = 64;

int CurrentDevice() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) return -1;
  return device;
}

// One kernel instantiation: its CTAs per SM with the shared memory it needs (asked once
// per device, which also raises the kernel's dynamic shared-memory limit), and its launch.
template <int HD, int GP, int WARPS, int STAGES>
struct DecodeKernel {
  using Shape = DecodeShape<HD, GP, WARPS, STAGES>;
  static int Occupancy() {
    static std::array<std::atomic<int>, kMaxDevices> cached{};
    const int device = CurrentDevice();
    int occupancy = device >= 0 ? cached[device].load(std::memory_order_relaxed) : 0;
    if (occupancy == 0) {
      auto* kernel = &DecodeSplitKernel<HD, GP, WARPS, STAGES>;
      if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(Shape::kSmemBytes)) != cudaSuccess ||
          cudaFuncSetAttribute(&DecodeSplitKernel<HD, GP, WARPS, STAGES, true>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(Shape::kSmemBytes)) != cudaSuccess ||
          cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occupancy, kernel, WARPS * 32, Shape::kSmemBytes) !=
              cudaSuccess ||
          occupancy <= 0) {
        return 1;  // no device (or no room): the launch reports the error
      }
      if (device >= 0) cached[device].store(occupancy, std::memory_order_relaxed);
    }
    return occupancy;
  }
  static cudaError_t Launch(const DecodeAttentionParams& p, int splits, int entries_per_split, cudaStream_t stream) {
    Occupancy();  // raises the shared-memory limit on this device if not done yet
    const unsigned ctas = static_cast<unsigned>(p.num_seqs) * splits * p.kv.n_kv_heads;
    if (splits > 1 && p.split_counters != nullptr) {
      return LaunchDependent(DecodeSplitKernel<HD, GP, WARPS, STAGES, true>, ctas, WARPS * 32, Shape::kSmemBytes,
                             stream, p, splits, entries_per_split);
    }
    return LaunchDependent(DecodeSplitKernel<HD, GP, WARPS, STAGES>, ctas, WARPS * 32, Shape::kSmemBytes, stream, p,
                           splits, entries_per_split);
  }
};

struct KernelEntry {
  int (*occupancy)();
  cudaError_t (*launch)(const DecodeAttentionParams&, int, int, cudaStream_t);
  size_t smem_bytes;  // the kernel's dynamic shared memory, all of it free for the last split's merge
};

template <int HD, int GP, int WARPS, int STAGES>
KernelEntry Entry() {
  return {&DecodeKernel<HD, GP, WARPS, STAGES>::Occupancy, &DecodeKernel<HD, GP, WARPS, STAGES>::Launch,
          DecodeShape<HD, GP, WARPS, STAGES>::kSmemBytes};
}

template <int HD, int WARPS, int STAGES>
KernelEntry EntryForGroup(int padded_group) {
  switch (padded_group) {
    case 1:
      return Entry<HD, 1, WARPS, STAGES>();
    case 2:
      return Entry<HD, 2, WARPS, STAGES>();
    case 4:
      return Entry<HD, 4, WARPS, STAGES>();
    default:
      return Entry<HD, 8, WARPS, STAGES>();
  }
}

// Index 0 is the default; the others exist at head dim 128 with groups of 3-4 (the
// benchmark's shape) for tuning.
constexpr detail::DecodeKernelConfig kConfigs[] = {{4, 3}, {4, 2}, {8, 2}, {4, 4}};
constexpr int kNumConfigs = sizeof(kConfigs) / sizeof(kConfigs[0]);

int ConfigIndex(detail::DecodeKernelConfig c) {
  for (int i = 0; i < kNumConfigs; ++i) {
    if (kConfigs[i].warps == c.warps && kConfigs[i].stages == c.stages) return i;
  }
  return 0;
}

KernelEntry SelectKernel(const DecodeAttentionParams& p, detail::DecodeKernelConfig config) {
  const int group = p.kv.n_kv_heads > 0 ? p.n_heads / p.kv.n_kv_heads : 1;
  const int padded = group <= 1 ? 1 : group <= 2 ? 2 : group <= 4 ? 4 : 8;
  if (p.kv.head_dim == 64) return EntryForGroup<64, 4, 3>(padded);
  if (padded == 4) {
    switch (ConfigIndex(config)) {
      case 1:
        return Entry<128, 4, 4, 2>();
      case 2:
        return Entry<128, 4, 8, 2>();
      case 3:
        return Entry<128, 4, 4, 4>();
      default:
        break;
    }
  }
  return EntryForGroup<128, 4, 3>(padded);
}

// Splits. One CTA of the default configuration streams about a full SM's share of the
// bandwidth, so the time is modelled per SM: the entries of the busiest SM (CTAs spread
// evenly over the SMs), a fixed cost per round of resident CTAs (prologue latency, pipeline
// fill, merge), and for more than one split the combine launch plus a cost per split.
// Measured on the H100 (bench/results/cuda_decode_2026-11-21.md): batch 1 at 4k-32k is
// fastest at 16 splits (one CTA per SM); batch >= 32 at one split.
// Units: the time an SM takes to stream one entry of 16 tokens.
constexpr int kMaxSplits = 1024;

int PickSplits(const DecodeAttentionParams& p, int ctas_per_sm) {
  if (p.num_splits > 0) return std::min({p.num_splits, std::max(1, p.max_entries_per_seq), kMaxSplits});
  const long long sms = MultiprocessorCount();
  const long long slots = sms * std::max(1, ctas_per_sm);
  const long long base = std::max(1, p.num_seqs * p.kv.n_kv_heads);
  const int entries = std::max(1, p.max_entries_per_seq);
  const int max_splits = std::max(1, std::min(256, (entries + 3) / 4));
  constexpr double kFixed = 6.0, kCombine = 6.0, kPerSplit = 0.25;
  int best = 1;
  double best_cost = 0.0;
  for (int s = 1; s <= max_splits; ++s) {
    const long long ctas = base * s;
    const double cost = static_cast<double>((ctas + sms - 1) / sms) * ((entries + s - 1) / s) +
                        kFixed * static_cast<double>((ctas + slots - 1) / slots) +
                        (s > 1 ? kCombine + kPerSplit * s : 0.0);
    if (s == 1 || cost < 0.97 * best_cost) {  // more splits only for a clear gain
      best = s;
      best_cost = cost;
    }
  }
  return best;
}

// The combine of a launch's splits: one row per sequence, one CTA per (sequence, head).
SplitCombineParams CombineParams(const DecodeAttentionParams& p, int splits) {
  SplitCombineParams c;
  c.workspace = p.workspace;
  c.out = p.out;
  c.pairs = static_cast<size_t>(p.num_seqs) * p.n_heads;
  c.splits = splits;
  c.n_heads = p.n_heads;
  c.head_dim = p.kv.head_dim;
  c.max_rows = p.num_seqs;
  return c;
}

bool ValidShapes(const DecodeAttentionParams& p) {
  return p.num_seqs > 0 && p.kv.n_kv_heads > 0 && p.n_heads > 0 && p.n_heads % p.kv.n_kv_heads == 0 &&
         p.n_heads / p.kv.n_kv_heads <= kMaxGroup && (p.kv.head_dim == 64 || p.kv.head_dim == 128) &&
         p.kv.block_size > 0 && p.kv.element == Element::kBf16 && p.max_entries_per_seq >= 0;
}

}  // namespace

namespace detail {

DecodeKernelConfig DefaultDecodeConfig() { return kConfigs[0]; }
int NumDecodeConfigs() { return kNumConfigs; }
DecodeKernelConfig DecodeConfigAt(int index) { return kConfigs[index >= 0 && index < kNumConfigs ? index : 0]; }

int ChooseDecodeSplitsFor(const DecodeAttentionParams& p, DecodeKernelConfig config) {
  return PickSplits(p, SelectKernel(p, config).occupancy());
}

cudaError_t LaunchLazyDecodeAttentionWith(DecodeAttentionParams p, DecodeKernelConfig config, cudaStream_t stream) {
  if (!ValidShapes(p)) return cudaErrorInvalidValue;
  const KernelEntry kernel = SelectKernel(p, config);
  const int splits = PickSplits(p, kernel.occupancy());
  const int entries_per_split = std::max(1, (p.max_entries_per_seq + splits - 1) / splits);
  // The last split merges where counters are given and its scratch fits the kernel's shared
  // memory; else the combine kernel runs after the launch.
  const int group = p.n_heads / p.kv.n_kv_heads;
  if (splits == 1 || LastSplitMergeScratchFloats(group, splits) * sizeof(float) > kernel.smem_bytes) {
    p.split_counters = nullptr;
  }
  if (const cudaError_t err = kernel.launch(p, splits, entries_per_split, stream); err != cudaSuccess) return err;
  if (splits > 1 && p.split_counters == nullptr) {
    return LaunchSplitCombine(CombineParams(p, splits), SplitCombineShape::kCtaPerPair, stream);
  }
  return cudaSuccess;
}

}  // namespace detail

int ChooseDecodeSplits(const DecodeAttentionParams& p) {
  return detail::ChooseDecodeSplitsFor(p, detail::DefaultDecodeConfig());
}

size_t DecodeWorkspaceBytes(const DecodeAttentionParams& p, int num_splits) {
  return SplitWorkspaceBytes(static_cast<size_t>(p.num_seqs) * p.n_heads, num_splits, p.kv.head_dim);
}

cudaError_t LaunchLazyDecodeAttention(DecodeAttentionParams p, cudaStream_t stream) {
  return detail::LaunchLazyDecodeAttentionWith(p, detail::DefaultDecodeConfig(), stream);
}

}  // namespace lazykv::cuda
