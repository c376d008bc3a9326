// A loaded server in-process: a RAG trace replayed through the engine's continuous
// batching (Submit / Step, no gRPC), with arrivals as vLLM's benchmark_serving makes them
// (a Poisson request rate, infinity: all at once, capped at a maximum concurrency), and a
// fresh engine per attention mode over one backend. What differs between the modes under
// load is memory: the block baseline reserves a private copy of every document per
// request, so fewer requests fit in the KV pool at once. Backend-agnostic: the CUDA
// benchmark (cuda_backend_bench --e2e-batched) and a CPU test run the same loop.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/load_stats.h"
#include "bench/rag_trace.h"
#include "worker/backend/backend.h"
#include "worker/engine/engine.h"

namespace lazykv {

// Lets a fresh engine (fresh allocator and chunk index) run on a backend that outlives it,
// so the modes share the weights and differ only in their engine.
// Not thread-safe, as every Backend.
class BorrowedBackend : public Backend {
 public:
  explicit BorrowedBackend(Backend* backend) : backend_(backend) {}
  const ModelConfig& config() const override { return backend_->config(); }
  std::string kv_dtype() const override { return backend_->kv_dtype(); }
  int block_size() const override { return backend_->block_size(); }
  int num_blocks() const override { return backend_->num_blocks(); }
  uint64_t kv_bytes_per_block() const override { return backend_->kv_bytes_per_block(); }
  Hash128 model_fingerprint() const override { return backend_->model_fingerprint(); }
  absl::Status Forward(std::span<const SequenceStep> steps, std::vector<std::vector<float>>* logits) override {
    return backend_->Forward(steps, logits);
  }
  absl::Status ForwardAndSample(std::span<const SequenceStep> steps, std::span<const StepSampling> sampling,
                                std::vector<SampledToken>* tokens, std::vector<std::vector<float>>* logits) override {
    return backend_->ForwardAndSample(steps, sampling, tokens, logits);
  }
  absl::Status CopyBlocksRotated(std::span<const BlockCopy> copies) override {
    return backend_->CopyBlocksRotated(copies);
  }
  absl::StatusOr<std::unique_ptr<ExportedChunk>> CaptureChunk(std::span<const KvBlockRef> blocks) override {
    return backend_->CaptureChunk(blocks);
  }
  absl::StatusOr<std::unique_ptr<StagedChunk>> StageChunk(const ChunkBytes& payload, const StageOptions& options) override {
    return backend_->StageChunk(payload, options);
  }
  absl::Status ImportStaged(std::unique_ptr<StagedChunk> staged, std::span<const KvBlockRef> blocks) override {
    return backend_->ImportStaged(std::move(staged), blocks);
  }
  absl::Status WarmUp(int max_rows, int max_logit_rows) override { return backend_->WarmUp(max_rows, max_logit_rows); }
  std::string ProfileSummary() const override { return backend_->ProfileSummary(); }

 private:
  Backend* backend_;
};

struct LoadOptions {
  // Requests per second, Poisson arrivals (from the trace's seed); infinity: all at once.
  double request_rate = std::numeric_limits<double>::infinity();
  // Requests submitted and not finished, at most (0: no limit). With an infinite rate this
  // is a closed loop at that concurrency.
  int max_concurrency = 64;
  // Prefill tokens per scheduling step (EngineOptions::max_prefill_tokens).
  int max_prefill_tokens = 512;
};

// One mode's run under load.
struct ModeLoadResult {
  AttentionMode mode = AttentionMode::kLazy;
  int requests = 0, completed = 0, failed = 0;
  std::string first_error;  // of the failed, the first status
  double duration_s = 0;    // the first submission to the last completion
  // From when a request could be sent (its arrival, or a concurrency slot freeing) to its
  // first token, as vLLM's benchmark_serving measures it.
  Distribution ttft_ms;
  // The same TTFT per number of the request's documents found cached.
  std::map<int64_t, Distribution> ttft_ms_by_cached_documents;
  Distribution queue_ms;          // submission to admission (waiting for KV pool room)
  double request_throughput = 0;  // completed requests per second
  double output_throughput = 0;   // generated tokens per second
  int64_t output_tokens = 0;
  // Per scheduling step that ran tokens, sampled before it: admitted requests, those
  // decoding (the decode batch), and those queued for pool room.
  int64_t steps = 0;
  double mean_running = 0, mean_decoding = 0, mean_queued = 0;
  int max_running = 0, max_decoding = 0, max_queued = 0;
  // Where the time goes: the mean step, and the steps that only decoded (no prefill), with
  // their mean batch; decode_step_ms / decode_step_batch is the cost of one decoded token.
  double mean_step_ms = 0;
  int64_t decode_steps = 0;
  double decode_step_ms = 0, decode_step_batch = 0;
  // Blocks not free (requests' and cached chunks') and reserved by admission, at peak.
  int num_blocks = 0, peak_blocks_used = 0, peak_blocks_reserved = 0;
  uint64_t evictions = 0;
  // The largest worst case of a trace request alone, and how many such requests the pool
  // holds if they share no document (lazy and block run more when they do).
  int worst_case_blocks = 0, worst_case_requests_fit = 0;
  int64_t prompt_tokens = 0, cached_tokens = 0, computed_tokens = 0;
  uint64_t kv_bytes_copied = 0;
  // Per trace request (by index): generated tokens; empty for a failed request.
  std::vector<std::vector<int32_t>> tokens;
};

// The trace's requests as the engine takes them: documents, question, greedy sampling.
std::vector<GenerateRequest> TraceToRequests(const RagTrace& trace);

// Replays `trace` through `engine` under `options`' arrivals on the calling thread until
// every request has finished or failed. A failed request is counted, not an error; an
// error means the run could not go on (the engine stopped making progress).
absl::StatusOr<ModeLoadResult> RunEngineLoad(Engine& engine, const RagTrace& trace, const LoadOptions& options);

// RunEngineLoad per mode, each on a fresh engine (empty pool and chunk index) over
// `backend`, with room in the engine's queue for the whole trace (so requests wait for
// the pool as a server's queue would, instead of being refused).
// `on_mode_done`, when given, sees each mode's result as soon as it is there (long runs
// show their rows as they go).
absl::StatusOr<std::vector<ModeLoadResult>> RunModesUnderLoad(
    Backend& backend, const RagTrace& trace, const std::vector<AttentionMode>& modes, const LoadOptions& options,
    const std::function<void(const ModeLoadResult&)>& on_mode_done = nullptr);

}  // namespace lazykv
