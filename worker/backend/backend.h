// The compute backend: owns the model weights and the KV pool memory, and runs the
// model. The engine above it plans block tables and never sees which device runs.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/chunk_bytes.h"
#include "common/chunk_codec.h"
#include "common/chunk_key.h"
#include "common/model_config.h"
#include "kernels/kv_block_ref.h"
#include "worker/backend/sampler.h"

namespace lazykv {

enum class LogitsWanted { kNone, kLast, kAll };

// New tokens of one sequence. `context` is the sequence's whole block table after this
// step: the new tokens fill its last tokens.size() slots (their blocks have delta 0),
// and each attends to every earlier slot and to itself.
struct SequenceStep {
  std::span<const int32_t> tokens;
  std::span<const KvBlockRef> context;
  LogitsWanted logits = LogitsWanted::kLast;
};

// Materialize for the block baseline: dst gets src's keys rotated by `delta`, values
// copied, in slots [first_slot, num_tokens) (a repaired chunk's rest of a block starts
// past slot 0).
struct BlockCopy {
  int32_t src_block = 0;
  int32_t dst_block = 0;
  int32_t num_tokens = 0;
  int32_t delta = 0;
  int32_t first_slot = 0;
};

// What ForwardAndSample does with one step's last row of logits.
struct StepSampling {
  bool sample = false;       // pick a token (the step must want LogitsWanted::kLast)
  RowSampling row;           // how (the uniform already drawn from the request's generator)
  bool keep_logits = false;  // return a sampled step's logits too (unsampled steps' always come back)
};

// A chunk's payload captured from the pool, waiting to be copied out. Thread-safe to hand
// to another thread; destroying it without CopyTo frees its staging memory.
class ExportedChunk {
 public:
  virtual ~ExportedChunk() = default;
  virtual uint64_t payload_bytes() const = 0;
  // Blocks until the payload is in `out` (host pieces whose sizes add up to
  // payload_bytes()). May run on any thread while the backend keeps stepping. Once.
  virtual absl::Status CopyTo(const MutablePieces& out) = 0;
};

// A payload staged for import (on the device for a GPU backend). Opaque to the engine.
class StagedChunk {
 public:
  virtual ~StagedChunk() = default;
  virtual uint64_t payload_bytes() const = 0;
};

// Not thread-safe (StageChunk aside): one engine's scheduling thread drives a backend (a GPU stream and
// its buffers, or the CPU pool).
class Backend {
 public:
  virtual ~Backend() = default;

  virtual const ModelConfig& config() const = 0;
  // Element type of stored KV ("fp32", "bf16"): part of the model fingerprint.
  virtual std::string kv_dtype() const = 0;
  virtual int block_size() const = 0;
  virtual int num_blocks() const = 0;
  virtual uint64_t kv_bytes_per_block() const = 0;
  // The model as a KV producer (weights and KV dtype): part of every chunk key.
  virtual Hash128 model_fingerprint() const = 0;

  // Runs the model over each step's new tokens, writing their K/V into the pool.
  // logits[i] holds step i's rows (none, its last token, or all its tokens) x vocab.
  virtual absl::Status Forward(std::span<const SequenceStep> steps, std::vector<std::vector<float>>* logits) = 0;

  // Forward, then a token for each step with sampling[i].sample: (*tokens)[i] is what
  // SampleRow(step i's logits, sampling[i].row) picks ({-1, 0} for the others). logits[i]
  // as Forward fills it, except empty for sampled steps without keep_logits, so a device
  // backend copies back only the rows someone reads. The default runs Forward and samples
  // on the host; the CUDA backend samples on the GPU.
  virtual absl::Status ForwardAndSample(std::span<const SequenceStep> steps, std::span<const StepSampling> sampling,
                                        std::vector<SampledToken>* tokens, std::vector<std::vector<float>>* logits);

  virtual absl::Status CopyBlocksRotated(std::span<const BlockCopy> copies) = 0;

  // Prepares what the backend chooses per pass shape for every pass of up to `max_rows` new
  // tokens and `max_logit_rows` rows of logits (on a GPU: a GEMM algorithm per row count,
  // the kernels loaded, activation and logits buffers at full size), so that the first step
  // at a new shape costs what later ones do: a worker serves its first requests at full
  // speed, and a benchmark's modes start equally warm. Leaves the KV pool alone. The
  // default does nothing (a CPU has nothing to prepare). INVALID_ARGUMENT for max_rows < 1
  // or max_logit_rows < 0.
  virtual absl::Status WarmUp(int max_rows, int max_logit_rows);
  // The backend's own counters in one line (empty: none), for a worker's step profile.
  virtual std::string ProfileSummary() const { return {}; }

  // Chunk transfer (DESIGN.md section 5b). A chunk's KV travels as a payload in the chunk
  // codec's layout (common/chunk_codec.h). Export and import are split so that the
  // scheduling thread only enqueues work and the bytes move on the chunk pipeline's
  // threads:
  //   export: CaptureChunk (scheduling thread, enqueued) -> ExportedChunk::CopyTo (a
  //           publisher thread, blocks until the bytes are in host memory);
  //   import: StageChunk (a pipeline thread, blocks until the bytes are on the device)
  //           -> ImportStaged (scheduling thread, enqueued before the next Forward).

  // Captures the slots of `blocks` as a payload. Enqueued in order with Forward: the KV
  // that earlier passes wrote is captured, and the blocks may be freed and rewritten
  // right after the call. RESOURCE_EXHAUSTED when staging memory is short (the caller
  // drops the publication).
  virtual absl::StatusOr<std::unique_ptr<ExportedChunk>> CaptureChunk(std::span<const KvBlockRef> blocks) = 0;
  // Thread-safe, unlike the other methods: copies a payload to where ImportStaged reads
  // it (device memory on a GPU) and returns once it is there. `payload` may rest in
  // pinned host pages (read in place) or anywhere else. RESOURCE_EXHAUSTED when staging
  // memory is short past options.wait_for_room_until.
  struct StageOptions {
    // Refuse a payload holding an infinity or a NaN (PERMISSION_DENIED naming the byte
    // offset), checked where the bytes land: on a GPU one pass at device memory speed, so a
    // fetch needs no CPU pass over its values (DESIGN.md section 5).
    bool check_finite = false;
    // Wait this long at most for staging room that staged chunks hold until imported (the
    // engine imports them at its next step). Unset: do not wait.
    std::optional<std::chrono::steady_clock::time_point> wait_for_room_until;
  };
  virtual absl::StatusOr<std::unique_ptr<StagedChunk>> StageChunk(const ChunkBytes& payload,
                                                                  const StageOptions& options) = 0;
  // Writes a staged payload into `blocks` (sizes must agree; checked). Enqueued in order
  // with Forward.
  virtual absl::Status ImportStaged(std::unique_ptr<StagedChunk> staged, std::span<const KvBlockRef> blocks) = 0;

  // Both directions at once on the calling thread (tests, benchmarks, the offline CLI).
  absl::Status ExportChunk(std::span<const KvBlockRef> blocks, std::string* payload);
  absl::Status ImportChunk(std::string_view payload, std::span<const KvBlockRef> blocks);
};

// The payload layout of a chunk of `num_tokens` tokens encoded after `anchor_tokens`.
ChunkLayout MakeChunkLayout(const ModelConfig& config, KvDtype dtype, int num_tokens, int anchor_tokens);

// Checks that blocks hold `payload`'s tokens (sizes agree, ids inside the pool).
absl::Status ValidateChunkBlocks(const ChunkLayout& layout, size_t payload_bytes, std::span<const KvBlockRef> blocks,
                                 int block_size, int num_blocks);

// Checks ForwardAndSample's arguments: one entry per step, sampled steps want their last
// row and have tokens, sampling parameters in range.
absl::Status ValidateSampling(std::span<const SequenceStep> steps, std::span<const StepSampling> sampling);

// Checks WarmUp's arguments (shared by every backend).
absl::Status ValidateWarmUpShape(int max_rows, int max_logit_rows);

// Checks a step against the pool's geometry (shared by every backend).
absl::Status ValidateStep(const SequenceStep& step, const ModelConfig& config, int block_size, int num_blocks);

// Checks CopyBlocksRotated's copies against the pool's geometry (shared by every backend).
absl::Status ValidateBlockCopies(std::span<const BlockCopy> copies, int block_size, int num_blocks);

// A backend's pool shape: block_size in [1, 4096], num_blocks positive.
absl::Status ValidatePoolShape(int block_size, int num_blocks);

}  // namespace lazykv
