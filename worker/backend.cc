#include "worker/backend.h"

#include "absl/strings/str_format.h"

namespace lazykv {

absl::Status ValidateStep(const SequenceStep& step, const ModelConfig& config, int block_size, int num_blocks) {
  int64_t total = 0;
  for (const KvBlockRef& ref : step.context) {
    if (ref.block < 0 || ref.block >= num_blocks) {
      return absl::InvalidArgumentError(absl::StrFormat("block id %d outside the pool of %d blocks", ref.block,
                                                        num_blocks));
    }
    if (ref.num_tokens < 0 || ref.num_tokens > block_size) {
      return absl::InvalidArgumentError(
          absl::StrFormat("block %d claims %d tokens; block size is %d", ref.block, ref.num_tokens, block_size));
    }
    total += ref.num_tokens;
  }
  if (static_cast<int64_t>(step.tokens.size()) > total) {
    return absl::InvalidArgumentError(absl::StrFormat("%d new tokens but the block table holds only %d slots",
                                                      step.tokens.size(), total));
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
