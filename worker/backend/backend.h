// The compute backend: owns the model weights and the KV pool memory, and runs the
// model. The engine above it plans block tables and never sees which device runs.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
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

// Materialize for the block baseline: dst gets src's keys rotated by `delta`, values copied.
struct BlockCopy {
  int32_t src_block = 0;
  int32_t dst_block = 0;
  int32_t num_tokens = 0;
  int32_t delta = 0;
};

// What ForwardAndSample does with one step's last row of logits.
struct StepSampling {
  bool sample = false;       // pick a token (the step must want LogitsWanted::kLast)
  RowSampling row;           // how (the uniform already drawn from the request's generator)
  bool keep_logits = false;  // return a sampled step's logits too (unsampled steps' always come back)
};

// Not thread-safe: one engine's scheduling thread drives a backend (a GPU stream and
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

  // A chunk's KV as a payload in the chunk codec's layout (common/chunk_codec.h), from
  // the slots of `blocks` (export), or into them (import, for fetched chunks).
  virtual absl::Status ExportChunk(std::span<const KvBlockRef> blocks, std::string* payload) = 0;
  virtual absl::Status ImportChunk(std::string_view payload, std::span<const KvBlockRef> blocks) = 0;
};

// The payload layout of a chunk of `num_tokens` tokens encoded after `anchor_tokens`.
ChunkLayout MakeChunkLayout(const ModelConfig& config, KvDtype dtype, int num_tokens, int anchor_tokens);

// Checks that blocks hold `payload`'s tokens (sizes agree, ids inside the pool).
absl::Status ValidateChunkBlocks(const ChunkLayout& layout, size_t payload_bytes, std::span<const KvBlockRef> blocks,
                                 int block_size, int num_blocks);

// Checks ForwardAndSample's arguments: one entry per step, sampled steps want their last
// row and have tokens, sampling parameters in range.
absl::Status ValidateSampling(std::span<const SequenceStep> steps, std::span<const StepSampling> sampling);

// Checks a step against the pool's geometry (shared by every backend).
absl::Status ValidateStep(const SequenceStep& step, const ModelConfig& config, int block_size, int num_blocks);

// Checks CopyBlocksRotated's copies against the pool's geometry (shared by every backend).
absl::Status ValidateBlockCopies(std::span<const BlockCopy> copies, int block_size, int num_blocks);

// A backend's pool shape: block_size in [1, 4096], num_blocks positive.
absl::Status ValidatePoolShape(int block_size, int num_blocks);

}  // namespace lazykv
