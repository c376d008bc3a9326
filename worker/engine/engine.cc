#include "worker/engine/engine.h"

#include <algorithm>
#include <numeric>
#include <optional>
#include <string_view>
#include <unordered_set>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"
#include "worker/engine/engine_state.h"

namespace lazykv {
namespace {

int CeilDiv(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

// Blocks first, first + 1, ..., first + count - 1 (a run KvBlockAllocator::AllocateRun gave).
std::vector<int32_t> RunOfBlocks(int32_t first, int count) {
  std::vector<int32_t> blocks(count);
  std::iota(blocks.begin(), blocks.end(), first);
  return blocks;
}

bool UsesChunks(AttentionMode mode) { return mode == AttentionMode::kLazy || mode == AttentionMode::kBlock; }

}  // namespace

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(std::unique_ptr<Backend> backend, EngineOptions options) {
  if (backend == nullptr) return absl::InvalidArgumentError("engine needs a backend");
  const ModelConfig& config = backend->config();
  if (options.anchorless) {
    if (!options.anchor.empty()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("an anchorless engine takes no anchor tokens (%d given)", options.anchor.size()));
    }
  } else if (options.anchor.empty()) {
    options.anchor = {config.bos_id};
  }
  for (int32_t token : options.anchor) {
    if (token < 0 || token >= config.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrFormat("anchor token %d outside the vocabulary of %d", token, config.vocab_size));
    }
  }
  if (options.max_prefill_tokens <= 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("max_prefill_tokens %d must be positive", options.max_prefill_tokens));
  }
  if (options.max_running_requests <= 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("max_running_requests %d must be positive", options.max_running_requests));
  }
  if (options.max_queued_requests < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("max_queued_requests %d must not be negative", options.max_queued_requests));
  }
  const Hash128 fingerprint = backend->model_fingerprint();
  ASSIGN_OR_RETURN(const KvDtype kv_dtype, ParseKvDtype(backend->kv_dtype()));
  return std::unique_ptr<Engine>(new Engine(std::move(backend), std::move(options), fingerprint, kv_dtype));
}

Engine::Engine(std::unique_ptr<Backend> backend, EngineOptions options, Hash128 fingerprint, KvDtype kv_dtype)
    : backend_(std::move(backend)),
      options_(std::move(options)),
      fingerprint_(fingerprint),
      kv_dtype_(kv_dtype),
      allocator_(backend_->num_blocks()),
      index_(&allocator_) {
  if (options_.tier) {
    pipeline_ =
        std::make_unique<ChunkPipeline>(options_.tier, backend_.get(), fingerprint_, kv_dtype_, options_.pipeline);
  }
}

// Requests and jobs give their blocks back before the index and the allocator go.
Engine::~Engine() {
  queued_.clear();
  running_.clear();
  jobs_.clear();
  pipeline_.reset();  // finishes publications while the allocator and the backend live
}

EngineStats Engine::stats() const {
  int decoding = 0;
  for (const auto& [id, request] : running_) decoding += request->phase == Request::Phase::kDecode;
  return EngineStats{.num_blocks = allocator_.num_blocks(),
                     .free_blocks = allocator_.num_free(),
                     .cached_entries = index_.size(),
                     .cached_blocks = index_.num_blocks(),
                     .evictions = index_.evictions(),
                     .queued_requests = static_cast<int>(queued_.size()),
                     .running_requests = static_cast<int>(running_.size()),
                     .decoding_requests = decoding,
                     .reserved_blocks = reserved_blocks_ + shared_reservations_.reserved_blocks(),
                     .peak_used_blocks = allocator_.peak_allocated()};
}

int Engine::CountHeldBlocks() const {
  std::vector<int> index_references(allocator_.num_blocks(), 0);
  index_.CountReferences(index_references);
  int held = 0;
  for (int b = 0; b < allocator_.num_blocks(); ++b) held += allocator_.refcount(b) > index_references[b];
  return held;
}

absl::Status Engine::ValidateRequest(const GenerateRequest& request) const {
  const ModelConfig& c = config();
  RETURN_IF_ERROR(request.sampling.Validate());
  auto check_tokens = [&](std::span<const int32_t> tokens, const std::string& field) -> absl::Status {
    for (size_t j = 0; j < tokens.size(); ++j) {
      if (tokens[j] < 0 || tokens[j] >= c.vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s[%d]: token id %d outside the vocabulary of %d", field, j, tokens[j], c.vocab_size));
      }
    }
    return absl::OkStatus();
  };
  int64_t total = options_.anchor.size() + request.prompt.size();
  for (size_t d = 0; d < request.docs.size(); ++d) {
    RETURN_IF_ERROR(check_tokens(request.docs[d], absl::StrFormat("documents[%d]", d)));
    total += request.docs[d].size();
  }
  RETURN_IF_ERROR(check_tokens(request.prompt, "prompt"));
  RETURN_IF_ERROR(check_tokens(request.sampling.stop_token_ids, "stop_token_ids"));
  if (request.repair_tokens < 0 || request.repair_tokens > c.max_seq_len) {
    return absl::InvalidArgumentError(absl::StrFormat("repair_tokens: %d must be in [0, %d] (the model's context)",
                                                      request.repair_tokens, c.max_seq_len));
  }
  if (total == 0) {
    return absl::InvalidArgumentError("request has no tokens: an anchorless engine needs a document or a prompt");
  }
  if (total + request.sampling.max_tokens > c.max_seq_len) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: the request needs %d positions (%d prompt tokens + max_tokens %d); the model's context is %d",
        total >= c.max_seq_len ? "prompt" : "max_tokens", total + request.sampling.max_tokens, total,
        request.sampling.max_tokens, c.max_seq_len));
  }
  const int needed = WorstCaseBlocks(request, request.mode.value_or(options_.mode));
  if (needed > backend_->num_blocks()) {
    return absl::InvalidArgumentError(absl::StrFormat("request may need %d KV blocks of %d tokens; the pool holds %d",
                                                      needed, backend_->block_size(), backend_->num_blocks()));
  }
  return absl::OkStatus();
}

int SharedDocumentCount(const GenerateRequest& request) {
  if (!request.prompt.empty()) return static_cast<int>(request.docs.size());
  return request.docs.empty() ? -1 : static_cast<int>(request.docs.size()) - 1;
}

std::vector<int> RepairPerDocument(const GenerateRequest& request, int shared_docs) {
  std::vector<int> repair(std::max(shared_docs, 0), 0);
  bool first = true;
  for (int d = 0; d < shared_docs; ++d) {
    const int size = static_cast<int>(request.docs[d].size());
    if (size == 0) continue;
    if (!first) repair[d] = std::min(request.repair_tokens, size);
    first = false;
  }
  return repair;
}

std::vector<bool> FirstOccurrences(const std::vector<std::vector<int32_t>>& docs) {
  std::vector<bool> first(docs.size());
  std::unordered_set<std::string_view> seen;  // hashing each document once, not comparing pairs
  for (size_t d = 0; d < docs.size(); ++d) {
    const std::string_view bytes(reinterpret_cast<const char*>(docs[d].data()), docs[d].size() * sizeof(int32_t));
    first[d] = seen.insert(bytes).second;
  }
  return first;
}

int Engine::WorstCaseBlocks(const GenerateRequest& request, AttentionMode mode) const {
  int64_t needed = PrivateWorstCaseBlocks(request, mode);
  const int shared_docs = UsesChunks(mode) ? SharedDocumentCount(request) : -1;
  if (shared_docs >= 0) {  // the blocks of SharedChunksOf (a repeated document once), without hashing
    const int bs = backend_->block_size();
    needed += CeilDiv(options_.anchor.size(), bs);
    const std::vector<bool> first = FirstOccurrences(request.docs);
    for (int d = 0; d < shared_docs; ++d) {
      if (first[d]) needed += CeilDiv(request.docs[d].size(), bs);
    }
  }
  return static_cast<int>(std::min<int64_t>(needed, INT32_MAX));
}

// Exactly what the request's own sequence will hold at most: its own tokens plus every
// token fed back while decoding (the last sampled token is never fed), from a fresh block
// after any shared chunk. In lazy and block modes the shared chunks are counted apart
// (SharedChunksOf); the block baseline also holds a re-rotated copy of each document it
// moves (every shared document but the first, which sits where it was encoded). A
// repaired document's first tokens are own tokens, in blocks of their own (in block mode
// they replace blocks of its copy).
int Engine::PrivateWorstCaseBlocks(const GenerateRequest& request, AttentionMode mode) const {
  const int bs = backend_->block_size();
  const int64_t fed = std::max(request.sampling.max_tokens - 1, 0);
  const int shared_docs = UsesChunks(mode) ? SharedDocumentCount(request) : -1;
  if (shared_docs < 0) {  // one sequence from position 0: anchor, documents, prompt
    int64_t total = options_.anchor.size() + request.prompt.size() + fed;
    for (const auto& doc : request.docs) total += doc.size();
    return static_cast<int>(std::min<int64_t>(CeilDiv(total, bs), INT32_MAX));
  }
  const size_t own = request.prompt.empty() ? request.docs.back().size() : request.prompt.size();
  int64_t needed = CeilDiv(own + fed, bs);
  if (mode == AttentionMode::kBlock) {
    bool first = true;
    for (int d = 0; d < shared_docs; ++d) {
      if (request.docs[d].empty()) continue;
      if (!first) needed += CeilDiv(request.docs[d].size(), bs);
      first = false;
    }
  } else if (request.repair_tokens > 0) {
    for (int repaired : RepairPerDocument(request, shared_docs)) needed += CeilDiv(repaired, bs);
  }
  return static_cast<int>(std::min<int64_t>(needed, INT32_MAX));
}

std::vector<SharedChunkReservations::Chunk> Engine::SharedChunksOf(const GenerateRequest& request,
                                                                   AttentionMode mode) const {
  std::vector<SharedChunkReservations::Chunk> chunks;
  const int shared_docs = UsesChunks(mode) ? SharedDocumentCount(request) : -1;
  if (shared_docs < 0) return chunks;
  const int bs = backend_->block_size();
  const std::vector<int32_t>& anchor = options_.anchor;
  if (!anchor.empty()) chunks.push_back({MakeAnchorKey(fingerprint_, anchor), CeilDiv(anchor.size(), bs)});
  for (int d = 0; d < shared_docs; ++d) {
    if (request.docs[d].empty()) continue;
    chunks.push_back({MakeChunkKey(fingerprint_, anchor, request.docs[d]), CeilDiv(request.docs[d].size(), bs)});
  }
  return chunks;
}

absl::StatusOr<int32_t> Engine::AllocateBlock() {
  if (allocator_.num_free() == 0 && !index_.EvictUntilFree(1)) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("KV pool exhausted: all %d blocks are held by running sequences", allocator_.num_blocks()));
  }
  return *allocator_.Allocate();
}

absl::StatusOr<std::vector<int32_t>> Engine::AllocateBlocks(int count) {
  std::vector<int32_t> blocks;
  if (count > 1) {
    if (const std::optional<int32_t> first = allocator_.AllocateRun(count)) return RunOfBlocks(*first, count);
  }
  for (int i = 0; i < count; ++i) {
    absl::StatusOr<int32_t> block = AllocateBlock();
    if (!block.ok()) {
      for (const int32_t b : blocks) allocator_.Unref(b);
      return block.status();
    }
    blocks.push_back(*block);
  }
  return blocks;
}

absl::Status Engine::GrowOwnTail(KvSequence& seq, size_t count, size_t ahead) {
  const int bs = backend_->block_size();
  const size_t room = seq.TailHasRoom(bs) ? static_cast<size_t>(bs - seq.table().back().num_tokens) : 0;
  const auto blocks_for = [&](size_t tokens) {
    return tokens > room ? static_cast<int>(CeilDiv(tokens - room, bs)) : 0;
  };
  const int needed = blocks_for(count);
  const int spares = static_cast<int>(seq.num_spare_own_blocks());
  const int missing = std::max(0, needed - spares);
  std::vector<int32_t> blocks;
  if (missing > 0) {
    // A piece of a document or question whose later pieces run in later steps: where no spare
    // is left, the whole remainder's blocks are taken now as one free run (without evicting),
    // so that the sequence's blocks stay consecutive while other sequences take blocks in the
    // steps between; those not used now wait as spares. Else this piece's blocks, one run
    // where one is free.
    const int later = spares == 0 ? blocks_for(count + ahead) - needed : 0;
    if (later > 0) {
      if (const std::optional<int32_t> first = allocator_.AllocateRun(missing + later)) {
        blocks = RunOfBlocks(*first, missing);
        seq.HoldSpareOwnBlocks(RunOfBlocks(*first + missing, later));
      }
    }
    if (blocks.empty()) {
      ASSIGN_OR_RETURN(blocks, AllocateBlocks(missing));
    }
  }
  // An earlier piece's spares come first (they follow its blocks); spares taken just now wait
  // for the later pieces.
  size_t next = 0;
  for (size_t i = 0; i < count; ++i) {
    if (!seq.TailHasRoom(bs)) {
      if (spares > 0 && seq.num_spare_own_blocks() > 0) {
        seq.AdoptSpareOwnBlock();
      } else {
        seq.AdoptEmptyOwnBlock(blocks[next++]);
      }
    }
    seq.FillTailSlot();
  }
  return absl::OkStatus();
}

absl::StatusOr<RequestId> Engine::Submit(GenerateRequest input) {
  RETURN_IF_ERROR(ValidateRequest(input));
  auto request = std::make_unique<Request>(&allocator_);
  request->id = next_id_++;
  request->arrived = input.arrival.value_or(SteadyClock::now());
  request->result.mode = input.mode.value_or(options_.mode);
  request->reserved_blocks = PrivateWorstCaseBlocks(input, request->result.mode);
  request->shared_chunks = SharedChunksOf(input, request->result.mode);
  request->input = std::move(input);
  const RequestId id = request->id;
  queued_.push_back(std::move(request));
  Admit();
  if (static_cast<int>(queued_.size()) > options_.max_queued_requests) {
    queued_.pop_back();  // the new request: admission is first come, first served
    return absl::ResourceExhaustedError(absl::StrFormat(
        "overloaded: %d requests run (max_running_requests=%d) and %d already wait for room "
        "(max_queued_requests=%d); retry after a backoff",
        running_.size(), options_.max_running_requests, options_.max_queued_requests, options_.max_queued_requests));
  }
  return id;
}

void Engine::Cancel(RequestId id, absl::Status reason) {
  for (auto it = queued_.begin(); it != queued_.end(); ++it) {
    if ((*it)->id == id) {
      queued_.erase(it);
      pending_events_.push_back(FailedEvent(id, reason));
      return;
    }
  }
  auto it = running_.find(id);
  if (it == running_.end()) return;
  Release(*it->second);
  running_.erase(it);
  pending_events_.push_back(FailedEvent(id, reason));
}

void Engine::StopEarly(RequestId id) {
  auto it = running_.find(id);
  if (it == running_.end()) return;
  it->second->result.finish_reason = "stop";
  Finish(*it->second, &pending_events_);
}

// Oldest first, while the pool can hold each one's worst case next to the running ones
// (shared chunks that running requests already use are reserved once, for all of them)
// and fewer than max_running_requests run.
void Engine::Admit() {
  while (!queued_.empty() && static_cast<int>(running_.size()) < options_.max_running_requests) {
    const Request& next = *queued_.front();
    const int needed = next.reserved_blocks + shared_reservations_.ExtraBlocks(next.shared_chunks);
    if (reserved_blocks_ + shared_reservations_.reserved_blocks() + needed > allocator_.num_blocks()) break;
    std::unique_ptr<Request> request = std::move(queued_.front());
    queued_.pop_front();
    reserved_blocks_ += request->reserved_blocks;
    shared_reservations_.Add(request->shared_chunks);
    request->result.queue_seconds = SecondsBetween(request->arrived, SteadyClock::now());
    Request& r = *request;
    running_.emplace(r.id, std::move(request));
    StartRequest(r);
  }
}

void Engine::StartRequest(Request& r) {
  const GenerateRequest& in = r.input;
  const std::vector<int32_t>& anchor = options_.anchor;
  auto& all = r.result.prompt_token_ids;
  all = anchor;
  r.first_occurrence = FirstOccurrences(in.docs);
  for (size_t d = 0; d < in.docs.size(); ++d) {
    all.insert(all.end(), in.docs[d].begin(), in.docs[d].end());
    if (r.first_occurrence[d]) r.result.usage.document_tokens += static_cast<int>(in.docs[d].size());
  }
  all.insert(all.end(), in.prompt.begin(), in.prompt.end());
  r.result.usage.prompt_tokens = static_cast<int>(all.size());
  r.result.seed = in.sampling.seed ? *in.sampling.seed : fresh_seeds_();
  r.rng.emplace(r.result.seed);
  r.phase = Request::Phase::kPrefill;
  switch (r.result.mode) {
    case AttentionMode::kNone:
      r.own = all;
      r.own_ready = r.own.size();
      r.result.usage.document_computed_tokens = r.result.usage.document_tokens;
      break;
    case AttentionMode::kPrefix:
      AttachCachedPrefix(r);
      r.own_ready = r.own.size();
      break;
    case AttentionMode::kBlock:
    case AttentionMode::kLazy:
      PlanChunks(r);
      break;
  }
}

void Engine::Release(Request& r) {
  for (ChunkSegment& segment : r.segments) {
    if (segment.ready) {  // not attached yet (attaching clears the list)
      for (const KvBlockRef& ref : segment.blocks) allocator_.Unref(ref.block);
    }
    segment.blocks.clear();
  }
  DropWaiter(r);
  r.seq.Clear();
  reserved_blocks_ -= r.reserved_blocks;
  r.reserved_blocks = 0;
  shared_reservations_.Remove(r.shared_chunks);
  r.shared_chunks.clear();
}

void Engine::Finish(Request& r, std::vector<EngineEvent>* events) {
  r.result.total_seconds = SecondsBetween(r.arrived, SteadyClock::now());
  if (r.result.tokens.empty() && r.result.finish_reason == "length") r.result.ttft_seconds = r.result.total_seconds;
  Release(r);
  events->push_back(EngineEvent{.id = r.id,
                                .kind = EngineEvent::Kind::kFinished,
                                .token = {},
                                .result = std::make_shared<const GenerateResult>(std::move(r.result)),
                                .status = absl::OkStatus()});
  running_.erase(r.id);  // destroys r
}

void Engine::Fail(Request& r, absl::Status status, std::vector<EngineEvent>* events) {
  spdlog::warn("request {} failed: {}", r.id, status.ToString());
  Release(r);
  events->push_back(FailedEvent(r.id, std::move(status)));
  running_.erase(r.id);  // destroys r
}

bool Engine::HasWork() const {
  return !queued_.empty() || !running_.empty() || !pending_events_.empty() || !jobs_.empty();
}

void Engine::WaitForTier(std::chrono::milliseconds timeout) {
  if (pipeline_ == nullptr) return;
  for (const auto& [key, job] : jobs_) {
    if (job->state == ChunkJob::State::kTier) {
      pipeline_->WaitForOutcome(timeout);
      return;
    }
  }
}

absl::StatusOr<GenerateResult> Engine::Generate(const GenerateRequest& request) {
  ASSIGN_OR_RETURN(const RequestId id, Submit(request));
  std::vector<EngineEvent> events;
  while (true) {
    events.clear();
    const int ran = Step(&events);
    for (EngineEvent& event : events) {
      if (event.id != id) continue;
      if (event.kind == EngineEvent::Kind::kFinished) return *event.result;
      if (event.kind == EngineEvent::Kind::kFailed) return event.status;
    }
    if (ran == 0) WaitForTier(std::chrono::milliseconds(20));
  }
}

}  // namespace lazykv
