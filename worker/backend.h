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

// Checks a step against the pool's geometry (shared by every backend).
absl::Status ValidateStep(const SequenceStep& step, const ModelConfig& config, int block_size, int num_blocks);

}  // namespace lazykv
