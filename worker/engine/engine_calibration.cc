// A worker's start-up measurement of what prefilling costs on its backend (the fetch-or-
// recompute decision's anchor, DESIGN.md section 4), which also warms the backend up
// (kernels loaded, GEMM plans chosen, the chunk-transfer paths used once) before the first
// request.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <random>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "worker/engine/engine.h"

namespace lazykv {

// Runs a chunk's export and import once (capture, copy-out, staging with the value check,
// import back into the same blocks), so the first fetch a worker measures is not also the
// first use of those paths (kernels loaded, staging memory and streams created): a slow
// first sample would make the cost model recompute what it should fetch.
absl::Status Engine::WarmUpChunkTransfer(std::span<const KvBlockRef> blocks) {
  std::string payload;
  {
    ASSIGN_OR_RETURN(std::unique_ptr<ExportedChunk> exported, backend_->CaptureChunk(blocks));
    payload.resize(exported->payload_bytes());
    RETURN_IF_ERROR(exported->CopyTo(MutablePieces{std::span<char>(payload.data(), payload.size())}));
  }  // its staging goes back before the import takes some
  ASSIGN_OR_RETURN(std::unique_ptr<StagedChunk> staged,
                   backend_->StageChunk(ChunkBytes::FromString(std::move(payload)), {.check_finite = true}));
  return backend_->ImportStaged(std::move(staged), blocks);
}

absl::Status Engine::WarmUpBackend() {
  return backend_->WarmUp(options_.max_prefill_tokens + options_.max_running_requests, options_.max_running_requests);
}

absl::StatusOr<double> Engine::CalibratePrefill(int tokens, int repeats) {
  if (tokens <= 0 || repeats <= 0) return absl::InvalidArgumentError("CalibratePrefill: tokens and repeats must be positive");
  if (HasWork()) return absl::FailedPreconditionError("CalibratePrefill: the engine is serving requests");
  const int bs = backend_->block_size();
  // The larger pass has twice the tokens asked for: a token's marginal cost is measured where
  // a busy step runs (hundreds of rows, the GEMMs compute-bound), not where a small pass is
  // still bound by reading the weights (on the H100, 8B: 256 -> 512 tokens cost 13 us a
  // token more, 512 -> 1024 about 25, as loaded steps do).
  tokens = std::min({2 * tokens, config().max_seq_len, (allocator_.num_free() / 2) * bs});
  if (tokens < 2) return absl::ResourceExhaustedError("CalibratePrefill: no room in the KV pool");
  std::mt19937 rng(1);
  std::uniform_int_distribution<int32_t> token(0, config().vocab_size - 1);
  std::vector<int32_t> input(tokens);
  for (int32_t& t : input) t = token(rng);
  // The fastest of `repeats` passes of `n` tokens, after one that warms the backend up.
  auto time_prefill = [&](int n, bool warm_up_transfer) -> absl::StatusOr<double> {
    double best = 0;
    for (int pass = 0; pass <= repeats; ++pass) {
      KvSequence seq(&allocator_);
      RETURN_IF_ERROR(GrowOwnTail(seq, n));
      const SequenceStep step{std::span(input).first(n), seq.table(), LogitsWanted::kLast};
      std::vector<std::vector<float>> logits;
      const auto start = std::chrono::steady_clock::now();
      RETURN_IF_ERROR(backend_->Forward(std::span(&step, 1), &logits));
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (pass > 0) best = pass == 1 ? seconds : std::min(best, seconds);
      if (pass == 0 && warm_up_transfer) {
        // Best effort: a worker that cannot warm these paths up still serves.
        if (absl::Status s = WarmUpChunkTransfer(seq.table()); !s.ok()) {
          spdlog::warn("chunk transfer warm-up failed: {}", s.ToString());
        }
      }
    }
    return best;
  };
  // A token's marginal cost: the difference between two sizes, so the pass's fixed cost
  // (the weights read once, the launches) is not spread over its tokens.
  const int half = tokens / 2;
  ASSIGN_OR_RETURN(const double full_seconds, time_prefill(tokens, /*warm_up_transfer=*/pipeline_ != nullptr));
  ASSIGN_OR_RETURN(const double half_seconds, time_prefill(half, false));
  double per_token = (full_seconds - half_seconds) / (tokens - half);
  if (!(per_token > 0)) per_token = full_seconds / tokens;  // noise swamped the difference
  if (pipeline_) pipeline_->cost_model().CalibratePrefill(tokens, per_token * tokens);
  spdlog::info("prefill calibration: {} tokens in {:.2f} ms, {} in {:.2f} ms ({:.2f} us per token more)", tokens,
               full_seconds * 1e3, half, half_seconds * 1e3, per_token * 1e6);
  return per_token;
}

}  // namespace lazykv
