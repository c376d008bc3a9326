// Lazy paged prefill attention: split choice and launch (the kernels are in
// lazy_prefill_kernels.cuh and lazy_prefill_specialized.cuh, the combine of splits in
// split_combine.cu).
#include <algorithm>
#include <atomic>
#include <cstdint>

#include "common/env_switch.h"
#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/lazy_prefill_attention.h"
#include "kernels/cuda/lazy_prefill_kernels.cuh"
#include "kernels/cuda/lazy_prefill_persistent.cuh"
#include "kernels/cuda/lazy_prefill_specialized.cuh"
#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/query_tensor_map.h"
#include "kernels/cuda/split_combine.h"

namespace lazykv::cuda {
namespace {

// Raises a kernel's dynamic shared memory limit once per device (one flag set per
// instantiation: the kernels share a pointer type).
template <int HD, int kSchedule, typename Kernel>
cudaError_t PrepareKernel(Kernel kernel, int smem_bytes) {
  constexpr int kMaxDevices = 64;
  static std::atomic<uint64_t> done{0};
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  const uint64_t bit = device < kMaxDevices ? (uint64_t{1} << device) : 0;
  if (bit != 0 && (done.load(std::memory_order_relaxed) & bit)) return cudaSuccess;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  if (err == cudaSuccess && bit != 0) done.fetch_or(bit, std::memory_order_relaxed);
  return err;
}

// Query tiles per sequence with 1 << log2_pack heads per tile.
int QueryTiles(const PrefillAttentionParams& p, int log2_pack) {
  return static_cast<int>(((static_cast<long long>(p.max_queries_per_seq) << log2_pack) + kBM - 1) / kBM);
}

int Log2(int x) {
  int l = 0;
  while ((1 << l) < x) ++l;
  return l;
}

// The heads per tile a launch of `schedule` uses: 0 where p.pack_heads cannot be honoured.
// Only the warp-specialized kernels pack, one work tile a CTA or persistent (their rotation
// warpgroup steps rows a position at a time per pack, RotateRowsByPosition).
int PackFor(const PrefillAttentionParams& p, int schedule) {
  if (p.pack_heads == 1) return 1;
  const int group = p.kv.n_kv_heads > 0 ? p.n_heads / p.kv.n_kv_heads : 1;
  const bool specialized = schedule == kSpecialized || schedule == kPersistent;
  const int most = specialized && p.kv.head_dim > 0 ? MaxPrefillPack(p.kv.head_dim) : 1;
  if (p.pack_heads == 0) {
    static_assert(kPrefillPackMaxQueries * 2 == kBM, "the header's bound is half a tile");
    if (p.max_queries_per_seq > kPrefillPackMaxQueries) return 1;  // an unpacked tile is at least half full
    int pack = 1;
    while (pack * 2 <= most && group % (pack * 2) == 0) pack *= 2;
    return pack;
  }
  const bool pow2 = p.pack_heads > 0 && (p.pack_heads & (p.pack_heads - 1)) == 0;
  return pow2 && p.pack_heads <= most && group % p.pack_heads == 0 ? p.pack_heads : 0;
}

// The work tiles of an unsplit launch with `pack` heads a tile (the persistent kernel's list).
long long UnsplitWorkTiles(const PrefillAttentionParams& p, int pack) {
  return static_cast<long long>(p.n_heads / pack) * QueryTiles(p, Log2(pack)) * p.num_seqs;
}

// One CTA fits on an SM: split the keys only when the launch fills less than one wave.
int SplitsFor(const PrefillAttentionParams& p, int pack) {
  if (p.num_splits > 0) return std::min(p.num_splits, kMaxSplits);
  const long long ctas = static_cast<long long>(std::max(1, p.n_heads / std::max(1, pack))) *
                         std::max(1, QueryTiles(p, Log2(std::max(1, pack)))) * std::max(1, p.num_seqs);
  const long long slots = MultiprocessorCount();
  return static_cast<int>(std::max(1LL, std::min<long long>(kMaxSplits, slots / ctas)));
}

// The splits of a launch with `pack` heads a tile, given a workspace: never more than
// ChoosePrefillSplits (the workspace's size; another schedule packs no more heads, so it launches
// at least as many CTAs), nor more groups than the grid's z allows.
int SplitsWithWorkspace(const PrefillAttentionParams& p, int pack) {
  int splits = std::min(SplitsFor(p, pack), ChoosePrefillSplits(p));
  while (splits > 1 && static_cast<long long>(p.num_seqs) * splits > 65535) --splits;
  return splits;
}

// Whether the kernel writes PrefillAttentionParams::out_bf16 itself: the one-tile and the
// persistent kernels do, unsplit; else the launcher converts `out` after the kernel.
bool KernelWritesBf16(int schedule, int splits) {
  return splits == 1 && (schedule == kSpecialized || schedule == kPersistent);
}

// The combine of a launch's splits: per sequence (grid y) its query rows, a warp per (row, head).
SplitCombineParams CombineParams(const PrefillAttentionParams& p, int splits) {
  SplitCombineParams c;
  c.workspace = p.workspace;
  c.out = p.out;
  c.row_offsets = p.query_offsets;
  c.pairs = PrefillWorkspacePairs(p);
  c.splits = splits;
  c.n_heads = p.n_heads;
  c.head_dim = p.kv.head_dim;
  c.max_rows = p.max_queries_per_seq;
  c.groups = p.num_seqs;
  return c;
}

// LAZYKV_PREFILL_DEPENDENT_LAUNCH=0: the prefill kernels launched as ordinary launches (the
// rest of the step's dependent launches unchanged), for comparisons.
template <typename Kernel, typename... Args>
cudaError_t LaunchPrefill(Kernel kernel, dim3 grid, int threads, int smem, cudaStream_t stream, const Args&... args) {
  static const bool dependent = EnvSwitchOn("LAZYKV_PREFILL_DEPENDENT_LAUNCH");
  if (dependent) return LaunchDependent(kernel, grid, threads, smem, stream, args...);
  kernel<<<grid, threads, smem, stream>>>(args...);
  return cudaGetLastError();
}

// The persistent grid's cap (an SM count is far under it).
constexpr long long kMaxPersistentCtas = 1 << 16;

struct KernelArgs {
  int log2bs;
  float scale_log2;
  int splits;
  int log2_pack;
  int max_ctas;  // kPersistent: the grid's cap (0: one CTA an SM)
};

// The list of `order` with what MakeWork needs from the launch's arguments.
WorkList ListOf(const PrefillWorkOrder& order, const KernelArgs& a) {
  return WorkList{order, a.log2bs, a.splits, a.log2_pack};
}

// The work starts of `list` (a warp each), made before a launch on them; ctas: the persistent
// grid's size (the list's count for the one-tile kernel).
template <int HD>
cudaError_t LaunchWorkStarts(const PrefillAttentionParams& p, const WorkList& list, long long ctas,
                             PrefillWorkStart* starts, cudaStream_t stream) {
  constexpr int kStartThreads = kWorkStartsWarps * 32;
  const long long blocks = (static_cast<long long>(list.order.count) * 32 + kStartThreads - 1) / kStartThreads;
  return LaunchPrefill(PrefillWorkStartsKernel<HD>, dim3(static_cast<unsigned>(blocks)), kStartThreads, 0, stream, p,
                       list, static_cast<int>(ctas), starts);
}

// Tensor maps over the launch's pools (1), by which the kernels copy KV tiles at consecutive pool
// slots, or none (0: every tile by cp.async) where the pools allow none or LAZYKV_PREFILL_KV_TMA=0.
int MakeKvMaps(const PrefillAttentionParams& p, CUtensorMap* k_map, CUtensorMap* v_map) {
#ifdef LAZYKV_PREFILL_PROBE_MATH_ONLY
  const bool on = false;  // the probe's copies read no memory: nor may boxes
#else
  static const bool on = EnvSwitchOn("LAZYKV_PREFILL_KV_TMA");
#endif
  *k_map = CUtensorMap{};
  *v_map = CUtensorMap{};
  return on && MakeKvPoolTensorMap(p, p.kv.k_pool, k_map) == cudaSuccess &&
                 MakeKvPoolTensorMap(p, p.kv.v_pool, v_map) == cudaSuccess
             ? 1
             : 0;
}

template <int HD, int kSchedule>
cudaError_t Launch(const PrefillAttentionParams& p, const KernelArgs& a, cudaStream_t stream) {
  const dim3 grid(p.n_heads >> a.log2_pack, QueryTiles(p, a.log2_pack), p.num_seqs * a.splits);
  if constexpr (kSchedule == kPersistent) {
    const long long count = static_cast<long long>(grid.x) * grid.y * grid.z;
    // A CTA's list index steps by the grid's size in int: it must not pass INT32_MAX.
    if (count + std::min<long long>(count, kMaxPersistentCtas) > INT32_MAX) return cudaErrorInvalidValue;
    const long long ctas =
        std::min<long long>({count, a.max_ctas > 0 ? a.max_ctas : MultiprocessorCount(), kMaxPersistentCtas});
    const WorkList list = ListOf(
        MakePrefillWorkOrder(static_cast<int>(grid.x), static_cast<int>(grid.y), static_cast<int>(grid.z), ctas), a);
    // Before any launch: a map the driver refuses launches nothing.
    CUtensorMap q_map, out_map = {};
    if (const cudaError_t e = MakeQueryTensorMap(p, 1 << a.log2_pack, &q_map); e != cudaSuccess) return e;
    if (p.out_bf16 != nullptr && a.splits == 1) {  // the kernel stores bf16 rows by TMA boxes
      if (const cudaError_t e = MakeOutputTensorMap(p, 1 << a.log2_pack, &out_map); e != cudaSuccess) return e;
    }
    // The work starts (PrefillWorkStartsBytes: sized for the unsplit list, which this one is).
    PrefillWorkStart* starts =
        a.splits == 1 && p.work_starts != nullptr ? static_cast<PrefillWorkStart*>(p.work_starts) : nullptr;
    if (starts != nullptr && !p.work_starts_made) {
      if (const cudaError_t e = LaunchWorkStarts<HD>(p, list, ctas, starts, stream); e != cudaSuccess) return e;
    }
    CUtensorMap k_map, v_map;
    const int kv_maps = MakeKvMaps(p, &k_map, &v_map);
    const auto kernel = LazyPrefillPersistentKernel<HD>;
    constexpr int kSmem = SpecSmemLayout<HD, PersistentStageInfo>::kAllocBytes;
    const cudaError_t err = PrepareKernel<HD, kSchedule>(kernel, kSmem);
    if (err != cudaSuccess) return err;
    if (const cudaError_t e =
            LaunchPrefill(kernel, dim3(static_cast<unsigned>(ctas)), kSpecThreads, kSmem, stream, p, list, a.scale_log2,
                          static_cast<const PrefillWorkStart*>(starts), q_map, out_map, k_map, v_map, kv_maps);
        e != cudaSuccess) {
      return e;
    }
  } else if constexpr (kSchedule == kSpecialized) {
    // The work starts, a record a CTA: PrefillWorkStartsBytes sizes them for the default launch's
    // grid, which no launch of this kernel exceeds (the same pack; SplitsWithWorkspace at most
    // ChoosePrefillSplits); the check keeps it so, and the list's indices in int.
    const long long count = static_cast<long long>(grid.x) * grid.y * grid.z;
    const bool fits = count <= INT32_MAX / 2 && count * static_cast<long long>(sizeof(PrefillWorkStart)) <=
                                                    static_cast<long long>(PrefillWorkStartsBytes(p));
    PrefillWorkStart* starts =
        p.work_starts != nullptr && fits ? static_cast<PrefillWorkStart*>(p.work_starts) : nullptr;
    if (starts != nullptr && !p.work_starts_made) {
      if (const cudaError_t e = LaunchWorkStarts<HD>(p, ListOf(OneTileWorkOrder(grid), a), count, starts, stream);
          e != cudaSuccess) {
        return e;
      }
    }
    CUtensorMap k_map, v_map;
    const int kv_maps = MakeKvMaps(p, &k_map, &v_map);
    const auto kernel = LazyPrefillSpecializedKernel<HD>;
    constexpr int kSmem = SpecSmemLayout<HD>::kAllocBytes;
    const cudaError_t err = PrepareKernel<HD, kSchedule>(kernel, kSmem);
    if (err != cudaSuccess) return err;
    if (const cudaError_t e = LaunchPrefill(kernel, grid, kSpecThreads, kSmem, stream, p, a.log2bs, a.scale_log2,
                                            a.splits, a.log2_pack, static_cast<const PrefillWorkStart*>(starts),
                                            p.work_starts_made ? 1 : 0, k_map, v_map, kv_maps);
        e != cudaSuccess) {
      return e;
    }
  } else {
    const auto kernel = LazyPrefillKernel<HD, kSchedule>;
    constexpr int kSmem = SmemLayout<HD>::kAllocBytes;
    const cudaError_t err = PrepareKernel<HD, kSchedule>(kernel, kSmem);
    if (err != cudaSuccess) return err;
    if (const cudaError_t e = LaunchPrefill(kernel, grid, kThreads, kSmem, stream, p, a.log2bs, a.scale_log2, a.splits);
        e != cudaSuccess) {
      return e;
    }
  }
  if (a.splits > 1) return LaunchSplitCombine(CombineParams(p, a.splits), SplitCombineShape::kWarpPerPair, stream);
  return cudaSuccess;
}

template <int HD>
cudaError_t LaunchSchedule(const PrefillAttentionParams& p, const KernelArgs& a, int schedule, cudaStream_t stream) {
  switch (schedule) {
    case kSerial:
      return Launch<HD, kSerial>(p, a, stream);
    case kStagger:
      return Launch<HD, kStagger>(p, a, stream);
    case kPersistent:
      return Launch<HD, kPersistent>(p, a, stream);
    default:
      return Launch<HD, kSpecialized>(p, a, stream);
  }
}

}  // namespace

int ChoosePrefillPack(const PrefillAttentionParams& p) { return PackFor(p, kSpecialized); }

int ChoosePrefillSplits(const PrefillAttentionParams& p) { return SplitsFor(p, ChoosePrefillPack(p)); }

size_t PrefillWorkStartsBytes(const PrefillAttentionParams& p) {
  const int pack = PackFor(p, kSpecialized);  // the persistent kernel's too (PackFor)
  if (pack <= 0 || p.num_seqs <= 0 || p.n_heads <= 0) return 0;
  // The persistent kernel's list is unsplit; the one-tile kernel's CTAs are as the default launch splits them.
  const long long starts = UnsplitWorkTiles(p, pack) * std::max(1, ChoosePrefillSplits(p));
  return static_cast<size_t>(starts) * sizeof(PrefillWorkStart);
}

size_t PrefillWorkspaceBytes(const PrefillAttentionParams& p, int num_splits) {
  if (num_splits <= 1) return 0;
  return SplitWorkspaceBytes(PrefillWorkspacePairs(p), num_splits, p.kv.head_dim);
}

namespace detail {

static_assert(kPersistentSchedule == kPersistent && kSpecializedSchedule == kSpecialized,
              "the header's schedule numbers are the launcher's");

int ChoosePrefillSchedule(const PrefillAttentionParams& p, int sms, int max_keys) {
  // Long KV loops over a long prefill's rows (queries at least a quarter of the keys), where
  // the kernel writes the bf16 output itself (with an fp32 output it was 0.97x the one-tile
  // kernel at 4k-16k; at an eighth of the keys 1.05x, at a 32nd 0.96x).
  // Up to kLongPrefillMaxKeys: past it the one-tile kernel, which now writes bf16 too, wins.
  const bool long_prefill = p.out_bf16 != nullptr && static_cast<long long>(p.max_queries_per_seq) * 4 >= p.max_keys &&
                            p.max_keys <= kLongPrefillMaxKeys;
  if (p.max_keys <= 0 || (p.max_keys > max_keys && !long_prefill) || sms <= 0 || p.num_splits > 1 ||
      !QueryTensorMapSupported(p)) {
    return kSpecialized;
  }
  const int pack = PackFor(p, kPersistent);
  if (pack <= 0) return kSpecialized;
  const long long works = UnsplitWorkTiles(p, pack);
  // Under two work tiles an SM the launch may split its keys (SplitsFor), and a second work
  // tile for some CTAs would be all a persistent grid adds.
  const long long least = p.persistent_min_work_tiles > 0 ? p.persistent_min_work_tiles : 2LL * sms;
  return works >= least ? kPersistent : kSpecialized;
}

cudaError_t SetPrefillTimeline(long long* stamps, int max_ctas, int max_tiles) {
#ifdef LAZYKV_PREFILL_TIMELINE
  const PrefillTimeline t{stamps, max_ctas, max_tiles};
  return cudaMemcpyToSymbol(g_prefill_timeline, &t, sizeof(t));
#else
  (void)stamps, (void)max_ctas, (void)max_tiles;
  return cudaErrorNotSupported;
#endif
}

const char* PrefillProbeName() {
#if defined(LAZYKV_PREFILL_PROBE_COPY_ONLY)
  return "copy_only";
#elif defined(LAZYKV_PREFILL_PROBE_MATH_ONLY)
  return "math_only";
#elif defined(LAZYKV_PREFILL_PROBE_QUERY_FREE)
  return "query_free";
#elif defined(LAZYKV_PREFILL_PROBE_OUT_FREE)
  return "out_free";
#else
  return nullptr;
#endif
}

cudaError_t LaunchLazyPrefillAttentionVariant(const PrefillAttentionParams& p, int schedule, cudaStream_t stream,
                                              int max_ctas) {
  const bool pow2_block = p.kv.block_size >= 16 && (p.kv.block_size & (p.kv.block_size - 1)) == 0;
  if (p.num_seqs <= 0 || p.num_seqs > 65535 || p.n_heads <= 0 || p.n_heads > 65535 || p.kv.n_kv_heads <= 0 ||
      p.n_heads % p.kv.n_kv_heads != 0 || (p.kv.head_dim != 64 && p.kv.head_dim != 128) || !pow2_block ||
      (p.kv.rope_style != RopeStyle::kInterleaved && p.kv.rope_style != RopeStyle::kRotateHalf) ||
      p.max_queries_per_seq < 0 || p.num_splits < 0 || p.kv.element != Element::kBf16) {
    return cudaErrorInvalidValue;
  }
  const int pack = PackFor(p, schedule);
  if (pack == 0 || QueryTiles(p, Log2(pack)) > 65535) return cudaErrorInvalidValue;  // the grid's y
  if (p.max_queries_per_seq == 0) return cudaSuccess;
  if (p.q == nullptr || p.kv.k_pool == nullptr || p.kv.v_pool == nullptr || p.kv.block_ids == nullptr ||
      p.kv.block_tokens == nullptr || p.kv.block_deltas == nullptr || p.kv.block_starts == nullptr ||
      p.kv.table_offsets == nullptr || p.query_offsets == nullptr || p.query_pos0 == nullptr ||
      p.kv.inv_freq == nullptr || p.out == nullptr) {
    return cudaErrorInvalidValue;
  }
  const size_t out_elements = static_cast<size_t>(std::max(p.total_queries, 0)) * p.n_heads * p.kv.head_dim;
  if (p.out_bf16 != nullptr) {  // all rows known, aligned, apart from `out`
    if (p.total_queries <= 0 || reinterpret_cast<uintptr_t>(p.out_bf16) % 16 != 0) return cudaErrorInvalidValue;
    const uintptr_t out = reinterpret_cast<uintptr_t>(p.out), out_bf16 = reinterpret_cast<uintptr_t>(p.out_bf16);
    if (out_bf16 < out + out_elements * sizeof(float) && out < out_bf16 + out_elements * 2) {
      return cudaErrorInvalidValue;
    }
  }
  const int splits = p.workspace == nullptr ? 1 : SplitsWithWorkspace(p, pack);
  const int log2bs = Log2(p.kv.block_size);
  const float scale_log2 = 1.4426950408889634f / sqrtf(static_cast<float>(p.kv.head_dim));
  const KernelArgs args{log2bs, scale_log2, splits, Log2(pack), max_ctas};
  const cudaError_t err = p.kv.head_dim == 64 ? LaunchSchedule<64>(p, args, schedule, stream)
                                              : LaunchSchedule<128>(p, args, schedule, stream);
  if (err != cudaSuccess) return err;
  if (p.out_bf16 != nullptr && !KernelWritesBf16(schedule, splits)) {  // the kernel wrote only out
    if (const cudaError_t e = LaunchToBf16(p.out, out_elements, static_cast<__nv_bfloat16*>(p.out_bf16), stream);
        e != cudaSuccess) {
      return e;
    }
  }
  return cudaGetLastError();
}

}  // namespace detail

namespace {

// The default launch's schedule. The warp-specialized kernel: 1.03-1.34x the two-warpgroup one
// with the rotation on, its rotation 1-4% (bench/results/cuda_prefill_2026-11-21e.md);
// persistent for short KV loops (bench/results/prefill_persistent_2026-11-28.md).
// LAZYKV_PREFILL_PERSISTENT=0: never the persistent kernel; LAZYKV_PREFILL_PERSISTENT_MAX_KEYS=N:
// its bound at N keys instead of kPersistentMaxKeys (for comparisons).
int DefaultSchedule(const PrefillAttentionParams& p) {
  static const bool persistent = EnvSwitchOn("LAZYKV_PREFILL_PERSISTENT");
  static const int forced_max_keys = EnvCount("LAZYKV_PREFILL_PERSISTENT_MAX_KEYS");
  const int max_keys = forced_max_keys > 0 ? forced_max_keys : detail::kPersistentMaxKeys;
  return persistent ? detail::ChoosePrefillSchedule(p, MultiprocessorCount(), max_keys) : kSpecialized;
}

}  // namespace

bool PrefillTakesPersistentKernel(const PrefillAttentionParams& p) { return DefaultSchedule(p) == kPersistent; }

bool PrefillWritesBf16(const PrefillAttentionParams& p) {
  const int schedule = DefaultSchedule(p);
  const int pack = PackFor(p, schedule);
  return p.out_bf16 != nullptr && pack > 0 && KernelWritesBf16(schedule, SplitsWithWorkspace(p, pack));
}

cudaError_t LaunchLazyPrefillAttention(const PrefillAttentionParams& p, cudaStream_t stream) {
  return detail::LaunchLazyPrefillAttentionVariant(p, DefaultSchedule(p), stream);
}

}  // namespace lazykv::cuda
