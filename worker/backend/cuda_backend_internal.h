// The CUDA backend's class, shared by its source files: cuda_backend.cc (setup, block
// copies, chunk transfer), cuda_forward.cc (the forward pass and the batched output layer)
// and cuda_sampling.cc (logits back to the host, sampling on the GPU). Private to them.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <type_traits>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "common/env_switch.h"
#include "common/mutex.h"
#include "common/status_macros.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/lazy_prefill_attention.h"
#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/paged_kv.h"
#include "kernels/cuda/shared_decode_attention.h"
#include "worker/backend/backend.h"
#include "worker/backend/cuda_backend.h"
#include "worker/backend/cuda_step_timing.h"
#include "worker/backend/cuda_weights.h"

namespace lazykv::cuda_backend {

using bf16 = __nv_bfloat16;

inline absl::Status Cuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  const auto code = e == cudaErrorMemoryAllocation ? absl::StatusCode::kResourceExhausted : absl::StatusCode::kInternal;
  return absl::Status(code, absl::StrFormat("%s: %s", what, cudaGetErrorString(e)));
}

// A device (or pinned host) allocation that grows to the largest size asked of it.
template <bool kPinnedHost>
class Buffer {
 public:
  ~Buffer() { Free(); }
  absl::Status Reserve(size_t bytes) {
    if (bytes <= capacity_) return absl::OkStatus();
    Free();
    const size_t grown = std::max(bytes, capacity_ + capacity_ / 2);
    RETURN_IF_ERROR(Cuda(kPinnedHost ? cudaMallocHost(&ptr_, grown) : cudaMalloc(&ptr_, grown),
                         kPinnedHost ? "pinned staging" : "device buffer"));
    capacity_ = grown;
    return absl::OkStatus();
  }
  template <typename T>
  T* as(size_t byte_offset = 0) const {
    return reinterpret_cast<T*>(static_cast<char*>(ptr_) + byte_offset);
  }

 private:
  void Free() {
    if (ptr_ != nullptr) kPinnedHost ? cudaFreeHost(ptr_) : cudaFree(ptr_);
    ptr_ = nullptr;
    capacity_ = 0;
  }
  void* ptr_ = nullptr;
  size_t capacity_ = 0;
};
using DeviceBuffer = Buffer<false>;
using PinnedBuffer = Buffer<true>;

// Int32 arrays packed into one pinned buffer and uploaded with one copy.
class MetaPack {
 public:
  size_t Add(const std::vector<int32_t>& v) {
    const size_t at = data_.size();
    data_.insert(data_.end(), v.begin(), v.end());
    data_.resize((data_.size() + 3) / 4 * 4);  // 16-byte aligned arrays
    return at;
  }
  // Trivially copyable structs of int32 fields (the shared decode plan's), as int32s.
  template <typename T>
  size_t AddStructs(const std::vector<T>& v) {
    static_assert(sizeof(T) % sizeof(int32_t) == 0 && std::is_trivially_copyable_v<T>);
    const int32_t* words = reinterpret_cast<const int32_t*>(v.data());
    return Add(std::vector<int32_t>(words, words + v.size() * (sizeof(T) / sizeof(int32_t))));
  }
  absl::Status Upload(PinnedBuffer& host, DeviceBuffer& device, cudaStream_t stream) {
    const size_t bytes = std::max<size_t>(1, data_.size()) * sizeof(int32_t);
    RETURN_IF_ERROR(host.Reserve(bytes));
    RETURN_IF_ERROR(device.Reserve(bytes));
    std::memcpy(host.as<int32_t>(), data_.data(), data_.size() * sizeof(int32_t));
    return Cuda(cudaMemcpyAsync(device.as<int32_t>(), host.as<int32_t>(), bytes, cudaMemcpyHostToDevice, stream),
                "metadata upload");
  }

 private:
  std::vector<int32_t> data_;
};

// One forward pass as RunModel lays it out: the new tokens' rows and, on the device, their
// metadata and the kernels' parameters over it.
struct PassPlan {
  int rows = 0;
  const int32_t* tokens = nullptr;
  const int32_t* last_pos = nullptr;  // per sequence: the position of its last token
  const int32_t* out_rows = nullptr;  // the rows that want logits
  int n_out = 0;
  cuda::PrefillAttentionParams attention;
  cuda::KvWriteParams kv_write;
  // Sequences [0, decode_seqs) run the decode kernel (every one in a decode step; the
  // leading decoding ones in a mixed step); 0: the prefill or generic kernel runs them all.
  int decode_seqs = 0;
  int decode_max_entries = 0;  // the longest block table among them
  // The prefill kernel's launches over the sequences after the decoding ones, in row order: one,
  // or two where RunModel laid few-query sequences (which pack heads into a tile) before longer
  // ones (PrefillStepOrder, step_order.h). None (num_pieces 0): one launch of `attention` runs every sequence.
  std::array<cuda::PrefillAttentionParams, 2> pieces;
  int num_pieces = 0;
  // The prefill kernel's launches, in row order: the pieces, else `attention` over every sequence.
  std::span<cuda::PrefillAttentionParams> PrefillLaunches() {
    return num_pieces > 0 ? std::span(pieces.data(), num_pieces) : std::span(&attention, 1);
  }
  // The attention output's rows [0, converted_rows) are converted to bf16 for a cuBLASLt output
  // GEMM (by default all); the rest are the prefill launches' (PrefillAttentionParams::out_bf16:
  // the one-tile and persistent kernels write them unsplit, cuda::PrefillWritesBf16; another
  // launch's launcher converts its own).
  int converted_rows = INT32_MAX;
  // The decoding sequences share chunk blocks: the chunk-shared attention's plan on the
  // device (its `base` is filled per layer from `attention`).
  bool shared_decode = false;
  cuda::SharedDecodeParams shared;
  // A decode step whose every new token is the last of its sequence's last table entry, run
  // by the decode kernel without chunk sharing: the kernel writes the new keys and values
  // itself (DecodeAttentionParams::new_tokens), and no KV write kernel runs.
  bool decode_writes_kv = false;
};

// The rows of logits a forward pass computed: per step that wants logits, a contiguous run
// of the logits matrix (rows in the order RunModel laid the steps out: PrefillStepOrder).
struct LogitsRows {
  size_t step;
  int first;  // row of the logits matrix
  int count;
};

// Device memory for chunks in transit (captured and not yet copied out, or staged and not
// yet imported), bounded. Thread-safe.
class TransferBudget {
 public:
  explicit TransferBudget(uint64_t limit) : limit_(limit) {}
  bool TryTake(uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // TryTake, waiting for Releases until `deadline` while it fails.
  bool TakeBy(uint64_t bytes, std::chrono::steady_clock::time_point deadline) ABSL_LOCKS_EXCLUDED(mu_);
  void Release(uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t used() const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t limit() const { return limit_; }

 private:
  const uint64_t limit_;
  mutable Mutex mu_;
  CondVar released_;
  uint64_t used_ ABSL_GUARDED_BY(mu_) = 0;
};

// Streams for the chunk pipeline's threads, reused (creating one per transfer costs more
// than a small copy). Thread-safe.
class StreamPool {
 public:
  explicit StreamPool(int device) : device_(device) {}
  ~StreamPool();
  // A stream of its own for the caller (the device made current on the calling thread).
  absl::StatusOr<cudaStream_t> Acquire() ABSL_LOCKS_EXCLUDED(mu_);
  void Release(cudaStream_t stream) ABSL_LOCKS_EXCLUDED(mu_);  // pending work may remain on it

 private:
  const int device_;
  Mutex mu_;
  std::vector<cudaStream_t> free_ ABSL_GUARDED_BY(mu_);
};

// Bytes of K and V one pool block holds across all layers.
uint64_t KvBytesPerBlock(const ModelConfig& config, int block_size, cuda::Element element);

class CudaBackend : public Backend {
 public:
  // options: its precision and GEMM choice are taken by the weights and Init.
  CudaBackend(std::unique_ptr<DeviceWeights> weights, int block_size, int num_blocks, const CudaBackendOptions& options)
      : w_(std::move(weights)),
        c_(w_->config()),
        element_(w_->element()),
        block_size_(block_size),
        num_blocks_(num_blocks),
        shared_decode_(options.shared_decode),
        decode_in_mixed_steps_(options.decode_in_mixed_steps),
        pack_prefill_heads_(options.pack_prefill_heads),
        // LAZYKV_ROTATE_Q_IN_KV_WRITE=0: never, whatever the options say (for comparisons).
        rotated_query_(EnvSwitchOn("LAZYKV_ROTATE_Q_IN_KV_WRITE") ? options.rotated_query : RotatedQuery::kNever),
        prefill_persistent_min_work_tiles_(options.prefill_persistent_min_work_tiles),
        budget_(std::make_shared<TransferBudget>(options.transfer_staging_bytes)) {}
  ~CudaBackend() override;
  absl::Status Init(cuda::GemmOptions gemm_options = {});

  const ModelConfig& config() const override { return c_; }
  std::string kv_dtype() const override { return cuda::ElementName(element_); }
  Hash128 model_fingerprint() const override { return MakeModelFingerprint(w_->content_hash(), kv_dtype()); }
  int block_size() const override { return block_size_; }
  int num_blocks() const override { return num_blocks_; }
  uint64_t kv_bytes_per_block() const override;

  absl::Status Forward(std::span<const SequenceStep> steps, std::vector<std::vector<float>>* logits) override;
  absl::Status ForwardAndSample(std::span<const SequenceStep> steps, std::span<const StepSampling> sampling,
                                std::vector<SampledToken>* tokens, std::vector<std::vector<float>>* logits) override;
  absl::Status CopyBlocksRotated(std::span<const BlockCopy> copies) override;
  // cuda_chunk_transfer.cc. StageChunk and ExportedChunk::CopyTo run on other threads:
  // they touch only their own streams, the budget and the stream-ordered allocator.
  absl::StatusOr<std::unique_ptr<ExportedChunk>> CaptureChunk(std::span<const KvBlockRef> blocks) override;
  absl::StatusOr<std::unique_ptr<StagedChunk>> StageChunk(const ChunkBytes& payload,
                                                          const StageOptions& options) override;
  absl::Status ImportStaged(std::unique_ptr<StagedChunk> staged, std::span<const KvBlockRef> blocks) override;
  // cuda_warm_up.cc: every GEMM shape of passes up to max_rows (and of the classifier up to
  // max_logit_rows) planned and run once, activation and logits buffers at full size.
  absl::Status WarmUp(int max_rows, int max_logit_rows) override;
  std::string ProfileSummary() const override;
  SharedDecodeStats shared_decode_stats() const { return shared_stats_; }
  PrefillLaunchStats prefill_launch_stats() const { return prefill_stats_; }
  GemmPlanStats gemm_plan_stats() const {
    const uint64_t plans = gemm_->plans();
    return {.warmed_up = gemm_plans_after_warm_up_.has_value(),
            .plans = plans,
            .plans_after_warm_up = plans - gemm_plans_after_warm_up_.value_or(plans)};
  }

 private:
  size_t PoolElems() const { return static_cast<size_t>(num_blocks_) * block_size_ * c_.kv_dim(); }
  size_t LayerPoolBytes() const { return PoolElems() * cuda::ElementBytes(element_); }
  void* KPool(int layer) const { return static_cast<char*>(k_pool_) + layer * LayerPoolBytes(); }
  void* VPool(int layer) const { return static_cast<char*>(v_pool_) + layer * LayerPoolBytes(); }
  KvDtype ChunkDtype() const { return element_ == cuda::Element::kFp32 ? KvDtype::kFp32 : KvDtype::kBf16; }
  // Layer `layer`'s pool as the kernels describe it: pools, element, geometry and RoPE (no
  // block table). Layer 0's pools are also the base of all layers (the chunk transfer's).
  cuda::PagedKv LayerKv(int layer) const;
  absl::Status ReserveActivations(int rows);
  // The decode kernel's split counters (DecodeAttentionParams::split_counters) for `slots`
  // (sequence, KV head) pairs, zeroed when they grow (stream-ordered on stream_).
  absl::Status ReserveSplitCounters(int slots);
  // Whether the tensor-core decode kernels (bf16, head dim 64 or 128) and prefill kernel
  // (also a power-of-two block of at least 16) run this model.
  bool DecodeKernelApplies() const;
  bool PrefillKernelApplies() const;
  struct SkinnyStep {
    bool small = false;  // the skinny GEMM's fused kernels (few rows)
    bool mma = false;    // the tensor-core skinny kernel's (5-16 rows)
  };
  SkinnyStep SkinnyStepFor(int rows) const;
  bool OutputGemmReadsBf16(int rows) const;
  absl::Status Attention(PassPlan& plan);
  // A decode step's chunk-shared attention plan, when it pays (shared_decode_): appended to
  // `pack`, its device pointers set in `plan` once the pack is uploaded (PointSharedPlan).
  // Returns the pack offsets, or nothing when the step runs the per-sequence kernel.
  struct SharedPlanOffsets {
    size_t items, members, parts, ids, tokens, deltas, starts, offsets;
    cuda::SharedDecodePlan plan;
  };
  std::optional<SharedPlanOffsets> PlanSharedDecode(const cuda::SharedDecodeTables& tables, int64_t total_tokens,
                                                    MetaPack& pack);
  // The layers over every step's new tokens, then the output layer over every row that
  // wants logits at once (one classifier GEMM into logits_). Enqueued, not synchronized.
  absl::Status RunModel(std::span<const SequenceStep> steps, std::vector<LogitsRows>* wanted);
  // RunModel's kernels and GEMMs, with T the element type of the weights, GEMM inputs and pool.
  template <typename T>
  absl::Status RunLayers(PassPlan& plan);
  template <typename T>
  absl::Status WarmUpGemms(int max_rows, int max_logit_rows);
  // Copies back the logits rows of the steps in `wanted` for which keep(step) holds (into
  // logits[step]); synchronizes the stream.
  template <typename Keep>
  absl::Status CopyLogitsBack(const std::vector<LogitsRows>& wanted, Keep keep,
                              std::vector<std::vector<float>>* logits);
  // Enqueues the transfer kernel between a device payload and `blocks` on stream_ (all
  // layers), with its metadata uploaded into `meta` (3 * blocks.size() ints, device).
  absl::Status EnqueueTransfer(const ChunkLayout& layout, std::span<const KvBlockRef> blocks, void* payload,
                               int32_t* meta, bool to_pool);

  std::unique_ptr<DeviceWeights> w_;
  const ModelConfig& c_;
  const cuda::Element element_;
  int block_size_;
  int num_blocks_;
  const SharedDecode shared_decode_;
  const bool decode_in_mixed_steps_;
  const bool pack_prefill_heads_;
  const RotatedQuery rotated_query_;
  const int prefill_persistent_min_work_tiles_;
  SharedDecodeStats shared_stats_;
  PrefillLaunchStats prefill_stats_;
  StepTiming step_timing_;  // small decode steps (cuda_step_timing.h)
  cudaStream_t stream_ = nullptr;
  // The chunk-shared decode's residual kernel runs on residual_stream_ beside the shared
  // kernel, forked and joined with these events (shared_decode_attention.h).
  cudaStream_t residual_stream_ = nullptr;
  cudaEvent_t residual_fork_ = nullptr, residual_join_ = nullptr;
  int device_ = 0;                          // the device of stream_ (set on the pipeline's threads too)
  std::shared_ptr<TransferBudget> budget_;  // shared with chunks in transit
  std::shared_ptr<StreamPool> streams_;     // the pipeline threads' streams (made in Init)
  std::unique_ptr<cuda::Gemm> gemm_;
  void* k_pool_ = nullptr;  // [n_layers][num_blocks][block_size][kv_dim] of element_
  void* v_pool_ = nullptr;
  double* inv_freq_ = nullptr;
  int activation_rows_ = 0;
  int split_counter_slots_ = 0;                     // zeroed slots of split_counters_
  std::optional<size_t> gemm_plans_after_warm_up_;  // unset: no WarmUp yet
  // Activations: x_, y_, qkv_, q_, attn_, gu_ fp32; xb_, attn_in_, h_ (GEMM inputs) of element_.
  DeviceBuffer x_, y_, xb_, qkv_, q_, attn_, attn_in_, gu_, h_, attn_ws_, meta_;
  DeviceBuffer work_starts_;        // the persistent prefill kernels' (Attention: a part a launch)
  DeviceBuffer split_counters_;     // int32, all zero between decode launches
  DeviceBuffer out_rows_, logits_;  // the output layer's gathered rows (element_) and its logits
  DeviceBuffer sample_rows_, sample_out_, sample_ws_, sample_slices_;
  PinnedBuffer meta_host_, logits_host_, sample_rows_host_, sample_out_host_;
};

}  // namespace lazykv::cuda_backend
