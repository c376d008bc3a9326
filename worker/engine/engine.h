// The generation engine: resolves each request's documents to KV according to the
// attention mode, prefills the rest, and decodes, for many requests at once. It plans
// block tables over the paged pool and drives a Backend; it does not know which device
// runs.
#pragma once

#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "common/chunk_key.h"
#include "worker/backend/backend.h"
#include "worker/backend/sampler.h"
#include "worker/engine/attention_mode.h"
#include "worker/engine/chunk_pipeline.h"
#include "worker/engine/kv_block_allocator.h"
#include "worker/engine/kv_cache_index.h"
#include "worker/engine/kv_sequence.h"
#include "worker/engine/shared_chunk_reservations.h"

namespace lazykv {

struct ChunkSegment;  // engine_state.h

// A request inside the engine.
using RequestId = uint64_t;

struct EngineOptions {
  AttentionMode mode = AttentionMode::kLazy;
  // Tokens every sequence starts with and every chunk is encoded after (DESIGN.md
  // section 2). Empty: the model's BOS token (unless anchorless).
  std::vector<int32_t> anchor;
  // No anchor at all (an experiment: the attention sink's worth): each document is
  // encoded alone from position 0, a sequence is `[docs][prompt][generated]` with no BOS
  // in any mode, and no anchor chunk exists. REQUIRES: `anchor` empty. A request then
  // needs at least one token (a document's or the prompt's).
  bool anchorless = false;
  // Prefill tokens (documents being encoded and requests' own tokens) per scheduling
  // step, on top of one token per decoding request: long prefills are cut into pieces
  // so decoding requests keep making progress (chunked prefill).
  int max_prefill_tokens = 512;
  // Requests running at once, at most: past it a request waits in the queue even when the
  // pool has room, so an overload lengthens the queue (then is refused) instead of slowing
  // every running request down. Each running request costs a batch slot every step.
  int max_running_requests = 256;
  // Requests waiting (for KV pool room or a running slot) past this bound are refused
  // (RESOURCE_EXHAUSTED, the message naming the limits).
  int max_queued_requests = 64;
  // The cache tier behind the local pool (null: the local pool only). Shared chunks and
  // the anchor are looked up there (fetched when that is faster than computing them),
  // computed under its lease, and published to it, through a ChunkPipeline.
  std::shared_ptr<ChunkTier> tier;
  ChunkPipelineOptions pipeline;
};

struct GenerateRequest {
  std::vector<std::vector<int32_t>> docs;
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  std::optional<AttentionMode> mode;  // overrides EngineOptions::mode
  bool record_logits = false;         // keep each decoding step's logits (tests)
  // Repair (lazy and block modes; DESIGN.md section 2): the first repair_tokens tokens of
  // every shared document but the first are computed again in context, after the
  // documents before them, instead of taken from the document's position-free KV; the rest
  // of each document still reuses it. Costs repair_tokens x (documents - 1) prefill
  // tokens (Usage::repaired_tokens). No effect in none and prefix modes, where every
  // token is computed in context already.
  int repair_tokens = 0;
  // When the request arrived (a server stamps the call's arrival, before tokenizing and
  // queueing for the engine thread): queue time, TTFT and total time count from here.
  // Absent: from Submit.
  std::optional<std::chrono::steady_clock::time_point> arrival;
};

struct Usage {
  int prompt_tokens = 0;             // the whole logical prompt: anchor, documents, prompt
  int cached_tokens = 0;             // of those, tokens whose KV was reused (pool + host + disk)
  int computed_tokens = 0;           // of those, tokens whose KV this request computed
  int pool_tokens = 0;               // reused tokens found in the local KV pool
  int host_tokens = 0;               // reused tokens fetched from the embedded cache tier's host RAM
  int disk_tokens = 0;               // reused tokens fetched from the embedded cache tier's disk
  int remote_tokens = 0;             // reused tokens fetched from a cache server
  int document_tokens = 0;           // the documents' tokens
  int document_cached_tokens = 0;    // of those, reused (any source)
  int document_computed_tokens = 0;  // of those, computed by this request
  int chunk_hits = 0;                // documents (and the anchor) reused, from any source
  int cached_documents = 0;          // the request's documents whose KV was reused whole (any source)
  int chunk_misses = 0;              // documents (and the anchor) encoded by this request: held nowhere
  // Documents (and the anchor) the cache tier held but this request encoded, because
  // recomputing was judged faster than fetching (or the fetch failed). Not misses.
  int chunk_recomputes = 0;
  int recomputed_tokens = 0;  // their tokens (part of computed_tokens)
  // Document tokens computed again in context by the repair (GenerateRequest::repair_tokens),
  // on top of computed_tokens: their reused KV counts as cached, where it came from.
  int repaired_tokens = 0;
  uint64_t kv_bytes_copied = 0;   // KV bytes written to reuse chunks (the block baseline's copies)
  uint64_t kv_bytes_fetched = 0;  // chunk bytes fetched from the cache tier (the three below)
  uint64_t host_bytes_fetched = 0;
  uint64_t disk_bytes_fetched = 0;
  uint64_t remote_bytes_fetched = 0;
};

struct GenerateResult {
  AttentionMode mode = AttentionMode::kLazy;
  std::vector<int32_t> prompt_token_ids;  // anchor, documents, prompt
  std::vector<int32_t> tokens;            // generated, EOS excluded
  std::vector<float> logprobs;
  std::string finish_reason;  // "stop" (EOS) or "length" (max_tokens)
  Usage usage;
  std::vector<std::vector<float>> step_logits;  // when record_logits
  uint64_t seed = 0;                            // the sampling seed used (drawn when the request gave none)
  double queue_seconds = 0;                     // arrival to admission (KV blocks reserved)
  double ttft_seconds = 0;                      // arrival to the first sampled token
  double total_seconds = 0;                     // arrival to the end of decoding
};

// What one scheduling step did to a request.
struct EngineEvent {
  enum class Kind { kToken, kFinished, kFailed };
  RequestId id = 0;
  Kind kind = Kind::kToken;
  SampledToken token{};                          // kToken
  std::shared_ptr<const GenerateResult> result;  // kFinished: the whole request
  absl::Status status;                           // kFailed
};

inline EngineEvent FailedEvent(RequestId id, absl::Status status) {
  EngineEvent event;
  event.id = id;
  event.kind = EngineEvent::Kind::kFailed;
  event.status = std::move(status);
  return event;
}

struct EngineStats {
  int num_blocks = 0;
  int free_blocks = 0;
  size_t cached_entries = 0;
  size_t cached_blocks = 0;
  uint64_t evictions = 0;
  int queued_requests = 0;    // waiting for pool room
  int running_requests = 0;   // admitted, not finished
  int decoding_requests = 0;  // of the running, those past prefill: the next step's decode batch
  int reserved_blocks = 0;    // worst-case blocks the running requests may need
  int peak_used_blocks = 0;   // the most blocks allocated at once since the engine started (held + cached)
};

// Where the scheduling thread's time went, summed over every Step (a profile of the step
// with the cache tier on: chunk bookkeeping and publication captures should stay a
// small fraction of the forward passes).
struct StepTimings {
  uint64_t steps = 0;
  double chunk_seconds = 0;    // admission and the chunk pipeline's outcomes (imports enqueued)
  double batch_seconds = 0;    // planning, the forward pass, sampling, events
  double forward_seconds = 0;  // of batch_seconds: Backend::ForwardAndSample
  double publish_seconds = 0;  // of batch_seconds: capturing computed chunks for publication
};

// Continuous batching over one backend. Requests are submitted, admitted when the pool
// can hold their worst case, and advanced by Step(): every step runs one forward pass
// over every decoding request plus up to max_prefill_tokens of prefill work (documents
// being encoded, requests' own tokens), so requests join and leave the batch at every
// step. A document missing from the pool is looked up in the cache tier off the
// scheduling thread; one encoding serves every request that waits for it.
// Not thread-safe: one thread drives an engine (worker/generation_loop.h).
class Engine {
 public:
  static absl::StatusOr<std::unique_ptr<Engine>> Create(std::unique_ptr<Backend> backend, EngineOptions options);
  ~Engine();

  // Validates and queues a request. INVALID_ARGUMENT names the offending field;
  // RESOURCE_EXHAUSTED when max_queued_requests are already waiting.
  absl::StatusOr<RequestId> Submit(GenerateRequest request);
  // Drops a queued or running request and frees its blocks at once; the request gets a
  // kFailed event with `reason` at the next Step. Unknown ids are ignored.
  void Cancel(RequestId id, absl::Status reason);
  // Ends a running request now, as if it had sampled end-of-sequence (a stop string
  // matched); it gets kFinished at the next Step.
  void StopEarly(RequestId id);
  // One scheduling step; appends what happened to `events`. Returns the tokens run (0:
  // nothing was runnable, e.g. every request waits on the cache tier).
  int Step(std::vector<EngineEvent>* events);
  bool HasWork() const;
  // With work waiting only on the cache tier: blocks until some arrives or `timeout`.
  void WaitForTier(std::chrono::milliseconds timeout);

  // Runs one request to completion on the calling thread (the offline CLI and tests).
  absl::StatusOr<GenerateResult> Generate(const GenerateRequest& request);

  // Times prefills of 2 x `tokens` and of `tokens` random tokens alone (capped by the
  // context and half the pool), fastest of `repeats` passes each after one that warms the backend up
  // (and, with a tier, its chunk transfer), and hands the marginal cost of a token (the
  // difference over the tokens between) to the chunk pipeline's cost model as its anchor.
  // Seconds per token.
  // REQUIRES: no request in the engine (a worker calls it before serving).
  // engine_calibration.cc
  absl::StatusOr<double> CalibratePrefill(int tokens, int repeats);
  // Backend::WarmUp for every pass this engine can run: up to max_prefill_tokens prefill
  // rows beside one row per running request, and logits for every running request. A worker
  // calls it before serving, a benchmark before its first mode (engine_calibration.cc).
  absl::Status WarmUpBackend();

  const ModelConfig& config() const { return backend_->config(); }
  const Hash128& model_fingerprint() const { return fingerprint_; }
  // The anchor's tokens (empty when anchorless).
  const std::vector<int32_t>& anchor() const { return options_.anchor; }
  AttentionMode default_mode() const { return options_.mode; }
  // The chunk pipeline to the cache tier (null without one).
  ChunkPipeline* pipeline() const { return pipeline_.get(); }
  EngineStats stats() const;
  const StepTimings& step_timings() const { return timings_; }
  // The backend's own counters in one line (Backend::ProfileSummary).
  std::string backend_profile() const { return backend_->ProfileSummary(); }
  // Blocks that running requests and chunk encodings hold now (referenced by anything but
  // the cache index, so not evictable): what admission's reservations must cover.
  // O(pool size): for tests and benchmarks, not for every step.
  int CountHeldBlocks() const;
  // The KV blocks admission reserves for `request` alone (its worst case, its shared
  // chunks included): what decides how many requests run at once when they share nothing.
  int ReservedBlocks(const GenerateRequest& request) const {
    return WorstCaseBlocks(request, request.mode.value_or(options_.mode));
  }

 private:
  struct Request;
  struct ChunkJob;
  struct PrefillWork;
  Engine(std::unique_ptr<Backend> backend, EngineOptions options, Hash128 fingerprint, KvDtype kv_dtype);

  absl::Status ValidateRequest(const GenerateRequest& request) const;
  // Worst case of one request: its private blocks plus its shared chunks' blocks.
  int WorstCaseBlocks(const GenerateRequest& request, AttentionMode mode) const;
  int PrivateWorstCaseBlocks(const GenerateRequest& request, AttentionMode mode) const;
  // Lazy and block modes: the anchor and the documents the request shares with others (the
  // chunks PlanChunks lays out), with their blocks.
  std::vector<SharedChunkReservations::Chunk> SharedChunksOf(const GenerateRequest& request, AttentionMode mode) const;
  absl::StatusOr<int32_t> AllocateBlock();
  // `count` blocks: the lowest run of consecutive free blocks where there is one (the prefill
  // kernels read a KV tile of consecutive blocks as one TMA copy), else one at a time as
  // AllocateBlock takes them (evicting as it does). On an error none is held.
  absl::StatusOr<std::vector<int32_t>> AllocateBlocks(int count);
  absl::Status WarmUpChunkTransfer(std::span<const KvBlockRef> blocks);  // engine_calibration.cc
  // Appends `count` own-token slots to `seq` (new blocks as needed). `ahead`: the sequence's own
  // tokens that later steps will append right after these (a document or question cut into
  // pieces), whose blocks are taken now where they and this piece's fit in one free run.
  absl::Status GrowOwnTail(KvSequence& seq, size_t count, size_t ahead = 0);

  // Admission (engine.cc).
  void Admit();
  void StartRequest(Request& request);
  void Finish(Request& request, std::vector<EngineEvent>* events);
  void Fail(Request& request, absl::Status status, std::vector<EngineEvent>* events);
  void Release(Request& request);

  // Shared chunks (engine_chunks.cc).
  void PlanChunks(Request& request);
  void AdvanceChunkJobs(std::vector<EngineEvent>* events);
  // Takes one answer of the chunk pipeline.
  void TakeOutcome(ChunkOutcome outcome, std::vector<EngineEvent>* events);
  // Hands a job's chunk to every waiter and ends the job.
  void CompleteJob(ChunkJob& job, std::span<const KvBlockRef> blocks, ChunkSource source, uint64_t fetched_bytes,
                   std::vector<EngineEvent>* events);
  void FailJob(ChunkJob& job, const absl::Status& status, std::vector<EngineEvent>* events);
  void DropWaiter(Request& request);
  // `recomputed`: computed here though the tier held it (usage counts it apart from misses).
  void TakeChunk(Request& request, size_t segment, std::span<const KvBlockRef> blocks, ChunkSource source,
                 uint64_t fetched_bytes, bool recomputed);
  // Attaches the request's ready segments in order, up to a repaired one whose own tokens
  // have not run yet (it makes them ready to run and stops); then the request prefills.
  absl::Status AttachReadySegments(Request& request);
  // A repaired segment whose own tokens ran: fills the rest of the block they end in from
  // the chunk and lets go of the chunk blocks they replaced. Returns the index of the
  // chunk's first block to attach as it is.
  absl::StatusOr<size_t> AttachRepairedHead(Request& request, const ChunkSegment& segment);
  absl::Status AttachChunk(KvSequence& seq, AttentionMode mode, std::span<const KvBlockRef> chunk, int32_t delta,
                           Usage& usage);
  // Imports a staged chunk into new blocks, and indexes them.
  absl::StatusOr<std::vector<KvBlockRef>> ImportChunk(const Hash128& key, int num_tokens,
                                                      std::unique_ptr<StagedChunk> staged);
  // Captures a computed chunk for the pipeline to publish (or drops it when its budget is full).
  void PublishChunk(const Hash128& key, std::span<const KvBlockRef> blocks, int anchor_tokens, uint64_t lease_id);
  void AttachCachedPrefix(Request& request);

  // One forward pass (engine_step.cc).
  std::vector<PrefillWork> PlanPrefill();
  int RunBatch(std::vector<PrefillWork>& prefill, std::vector<EngineEvent>* events);
  void FinishEncoding(ChunkJob& job, std::vector<EngineEvent>* events);
  // Takes the token the backend sampled for the request (and its logits, when recorded).
  void SampleNext(Request& request, const SampledToken& next, std::span<const float> logits,
                  std::vector<EngineEvent>* events);

  std::unique_ptr<Backend> backend_;
  EngineOptions options_;
  Hash128 fingerprint_;
  KvDtype kv_dtype_;
  KvBlockAllocator allocator_;
  KvCacheIndex index_;
  RequestId next_id_ = 1;
  std::deque<std::unique_ptr<Request>> queued_;
  std::map<RequestId, std::unique_ptr<Request>> running_;  // ordered: oldest first
  std::vector<EngineEvent> pending_events_;                // cancellations, reported at the next Step
  std::unordered_map<Hash128, std::unique_ptr<ChunkJob>, Hash128Hasher> jobs_;
  int reserved_blocks_ = 0;  // running requests' private worst cases
  StepTimings timings_;
  SharedChunkReservations shared_reservations_;
  std::mt19937_64 fresh_seeds_{std::random_device{}()};  // seeds for requests that give none
  // Last: destroyed first, while the backend its threads use still lives.
  std::unique_ptr<ChunkPipeline> pipeline_;
};

}  // namespace lazykv
