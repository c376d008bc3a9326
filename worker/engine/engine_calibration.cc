// A worker's start-up measurement of what prefilling costs on its backend (the fetch-or-
// recompute decision's anchor, DESIGN.md section 4), which also warms the backend up
// (kernels loaded, GEMM plans chosen) before the first request.
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
  ASSIGN_OR_RETURN(std::unique_ptr<ExportedChunk> exported, backend_->CaptureChunk(blocks));
  std::string payload(exported->payload_bytes(), '\0');
  RETURN_IF_ERROR(exported->CopyTo(MutablePieces{std::span<char>(payload.data(), payload.size())}));
  ASSIGN_OR_RETURN(std::unique_ptr<StagedChunk> staged,
                   backend_->StageChunk(ChunkBytes::FromString(std::move(payload)), {.check_finite = true}));
  return backend_->ImportStaged(std::move(staged), blocks);
}

absl::StatusOr<double> Engine::CalibratePrefill(int tokens, int repeats) {
  if (tokens <= 0 || repeats <= 0) return absl::InvalidArgumentError("CalibratePrefill: tokens and repeats must be positive");
  if (HasWork()) return absl::FailedPreconditionError("CalibratePrefill: the engine is serving requests");
  const int bs = backend_->block_size();
  tokens = std::min({tokens, config().max_seq_len, (allocator_.num_free() / 2) * bs});
  if (tokens <= 0) return absl::ResourceExhaustedError("CalibratePrefill: no room in the KV pool");
  std::mt19937 rng(1);
  std::uniform_int_distribution<int32_t> token(0, config().vocab_size - 1);
  std::vector<int32_t> input(tokens);
  for (int32_t& t : input) t = token(rng);
  double best = 0;
  // The first pass warms the backend up; the fastest of the others is the measurement.
  for (int pass = 0; pass <= repeats; ++pass) {
    KvSequence seq(&allocator_);
    RETURN_IF_ERROR(GrowOwnTail(seq, input.size()));
    const SequenceStep step{input, seq.table(), LogitsWanted::kLast};
    std::vector<std::vector<float>> logits;
    const auto start = std::chrono::steady_clock::now();
    RETURN_IF_ERROR(backend_->Forward(std::span(&step, 1), &logits));
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (pass > 0) best = pass == 1 ? seconds : std::min(best, seconds);
    if (pass == 0) RETURN_IF_ERROR(WarmUpChunkTransfer(seq.table()));
  }
  if (pipeline_) pipeline_->cost_model().CalibratePrefill(tokens, best);
  spdlog::info("prefill calibration: {} tokens in {:.2f} ms ({:.2f} us per token)", tokens, best * 1e3,
               best / tokens * 1e6);
  return best / tokens;
}

}  // namespace lazykv
