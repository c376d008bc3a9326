#include "worker/backend/backend.h"

#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace lazykv {

absl::Status Backend::ExportChunk(std::span<const KvBlockRef> blocks, std::string* payload) {
  ASSIGN_OR_RETURN(std::unique_ptr<ExportedChunk> exported, CaptureChunk(blocks));
  payload->resize(exported->payload_bytes());
  return exported->CopyTo(MutablePieces{std::span<char>(payload->data(), payload->size())});
}

absl::Status Backend::ImportChunk(std::string_view payload, std::span<const KvBlockRef> blocks) {
  // The view stays valid for the whole call, and StageChunk has read it when it returns.
  ASSIGN_OR_RETURN(std::unique_ptr<StagedChunk> staged, StageChunk(ChunkBytes({payload}, nullptr), StageOptions{}));
  return ImportStaged(std::move(staged), blocks);
}

absl::Status ValidateWarmUpShape(int max_rows, int max_logit_rows) {
  if (max_rows < 1) return absl::InvalidArgumentError(absl::StrFormat("WarmUp: max_rows %d must be >= 1", max_rows));
  if (max_logit_rows < 0) {
    return absl::InvalidArgumentError(absl::StrFormat("WarmUp: max_logit_rows %d must be >= 0", max_logit_rows));
  }
  return absl::OkStatus();
}

absl::Status Backend::WarmUp(int max_rows, int max_logit_rows) { return ValidateWarmUpShape(max_rows, max_logit_rows); }

absl::Status ValidateStep(const SequenceStep& step, const ModelConfig& config, int block_size, int num_blocks) {
  int64_t total = 0;
  for (const KvBlockRef& ref : step.context) {
    if (ref.block < 0 || ref.block >= num_blocks) {
      return absl::InvalidArgumentError(
          absl::StrFormat("block id %d outside the pool of %d blocks", ref.block, num_blocks));
    }
    if (ref.num_tokens < 0 || ref.num_tokens > block_size) {
      return absl::InvalidArgumentError(
          absl::StrFormat("block %d claims %d tokens; block size is %d", ref.block, ref.num_tokens, block_size));
    }
    total += ref.num_tokens;
  }
  if (static_cast<int64_t>(step.tokens.size()) > total) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%d new tokens but the block table holds only %d slots", step.tokens.size(), total));
  }
  for (int32_t token : step.tokens) {
    if (token < 0 || token >= config.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrFormat("token id %d outside the vocabulary of %d", token, config.vocab_size));
    }
  }
  return absl::OkStatus();
}

}  // namespace lazykv

namespace lazykv {

ChunkLayout MakeChunkLayout(const ModelConfig& config, KvDtype dtype, int num_tokens, int anchor_tokens) {
  return ChunkLayout{.num_layers = static_cast<uint32_t>(config.n_layers),
                     .n_kv_heads = static_cast<uint32_t>(config.n_kv_heads),
                     .head_dim = static_cast<uint32_t>(config.head_dim),
                     .num_tokens = static_cast<uint32_t>(num_tokens),
                     .anchor_tokens = static_cast<uint32_t>(anchor_tokens),
                     .dtype = dtype};
}

absl::Status ValidateChunkBlocks(const ChunkLayout& layout, size_t payload_bytes, std::span<const KvBlockRef> blocks,
                                 int block_size, int num_blocks) {
  int64_t tokens = 0;
  for (const KvBlockRef& ref : blocks) {
    if (ref.block < 0 || ref.block >= num_blocks || ref.num_tokens < 0 || ref.num_tokens > block_size) {
      return absl::InvalidArgumentError(absl::StrFormat("chunk block %d (%d tokens) does not fit a pool of %d x %d",
                                                        ref.block, ref.num_tokens, num_blocks, block_size));
    }
    tokens += ref.num_tokens;
  }
  if (tokens != layout.num_tokens || payload_bytes != layout.payload_bytes()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("chunk payload of %d bytes (%d tokens) does not match blocks holding %d tokens", payload_bytes,
                        layout.num_tokens, tokens));
  }
  return absl::OkStatus();
}

absl::Status ValidatePoolShape(int block_size, int num_blocks) {
  if (block_size <= 0 || block_size > 4096) {
    return absl::InvalidArgumentError(absl::StrFormat("block_size %d out of range [1, 4096]", block_size));
  }
  if (num_blocks <= 0) return absl::InvalidArgumentError(absl::StrFormat("num_blocks %d must be positive", num_blocks));
  return absl::OkStatus();
}

absl::Status ValidateBlockCopies(std::span<const BlockCopy> copies, int block_size, int num_blocks) {
  for (const BlockCopy& copy : copies) {
    for (int32_t b : {copy.src_block, copy.dst_block}) {
      if (b < 0 || b >= num_blocks) {
        return absl::InvalidArgumentError(absl::StrFormat("block id %d outside the pool of %d", b, num_blocks));
      }
    }
    if (copy.num_tokens < 0 || copy.num_tokens > block_size) {
      return absl::InvalidArgumentError(
          absl::StrFormat("copy of %d tokens; block size is %d", copy.num_tokens, block_size));
    }
    if (copy.first_slot < 0 || copy.first_slot > copy.num_tokens) {
      return absl::InvalidArgumentError(
          absl::StrFormat("copy from slot %d to slot %d: first_slot outside [0, num_tokens]", copy.first_slot,
                          copy.num_tokens));
    }
  }
  return absl::OkStatus();
}

}  // namespace lazykv
