#include "worker/engine.h"

#include <chrono>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"

namespace lazykv {

// A sequence's block table and the block references it holds (released on destruction,
// so every error path gives its blocks back).
class Engine::Sequence {
 public:
  explicit Sequence(KvBlockAllocator* allocator) : allocator_(allocator) {}
  ~Sequence() {
    for (int32_t block : held_) allocator_->Unref(block);
  }
  Sequence(const Sequence&) = delete;
  Sequence& operator=(const Sequence&) = delete;

  // Appends blocks whose references the caller hands over.
  void AdoptBlocks(std::span<const KvBlockRef> refs, int32_t delta) {
    for (const KvBlockRef& ref : refs) {
      table_.push_back(KvBlockRef{ref.block, ref.num_tokens, delta});
      held_.push_back(ref.block);
    }
    tail_is_own_ = false;  // the next own token starts a new block
  }
  // Appends blocks the caller keeps holding too (takes a reference of its own).
  void ShareBlocks(std::span<const KvBlockRef> refs) {
    for (const KvBlockRef& ref : refs) allocator_->Ref(ref.block);
    AdoptBlocks(refs, 0);
  }
  void AdoptEmptyOwnBlock(int32_t block) {
    table_.push_back(KvBlockRef{block, 0, 0});
    held_.push_back(block);
    tail_is_own_ = true;
  }
  bool TailHasRoom(int block_size) const { return tail_is_own_ && table_.back().num_tokens < block_size; }
  void FillTailSlot() { ++table_.back().num_tokens; }
  const std::vector<KvBlockRef>& table() const { return table_; }

 private:
  KvBlockAllocator* allocator_;
  std::vector<KvBlockRef> table_;
  std::vector<int32_t> held_;
  bool tail_is_own_ = false;
};

namespace {

int CeilDiv(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

}  // namespace

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(std::unique_ptr<Backend> backend, EngineOptions options) {
  if (backend == nullptr) return absl::InvalidArgumentError("engine needs a backend");
  const ModelConfig& config = backend->config();
  if (options.anchor.empty()) options.anchor = {config.bos_id};
  for (int32_t token : options.anchor) {
    if (token < 0 || token >= config.vocab_size) {
      return absl::InvalidArgumentError(absl::StrFormat("anchor token %d outside the vocabulary of %d", token,
                                                        config.vocab_size));
    }
  }
  if (options.max_prefill_tokens <= 0) {
    return absl::InvalidArgumentError(absl::StrFormat("max_prefill_tokens %d must be positive",
                                                      options.max_prefill_tokens));
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
      index_(&allocator_) {}

EngineStats Engine::stats() const {
  return EngineStats{.num_blocks = allocator_.num_blocks(),
                     .free_blocks = allocator_.num_free(),
                     .cached_entries = index_.size(),
                     .cached_blocks = index_.num_blocks(),
                     .evictions = index_.evictions()};
}

absl::Status Engine::ValidateRequest(const GenerateRequest& request) const {
  const ModelConfig& c = config();
  RETURN_IF_ERROR(request.sampling.Validate());
  auto check_tokens = [&](std::span<const int32_t> tokens, const std::string& field) -> absl::Status {
    for (size_t j = 0; j < tokens.size(); ++j) {
      if (tokens[j] < 0 || tokens[j] >= c.vocab_size) {
        return absl::InvalidArgumentError(absl::StrFormat("%s[%d]: token id %d outside the vocabulary of %d", field,
                                                          j, tokens[j], c.vocab_size));
      }
    }
    return absl::OkStatus();
  };
  int64_t total = options_.anchor.size() + request.prompt.size();
  for (size_t d = 0; d < request.docs.size(); ++d) {
    RETURN_IF_ERROR(check_tokens(request.docs[d], absl::StrFormat("docs[%d]", d)));
    total += request.docs[d].size();
  }
  RETURN_IF_ERROR(check_tokens(request.prompt, "prompt"));
  if (total + request.sampling.max_tokens > c.max_seq_len) {
    return absl::InvalidArgumentError(
        absl::StrFormat("request needs %d positions (%d prompt tokens + max_tokens %d); the model's context is %d",
                        total + request.sampling.max_tokens, total, request.sampling.max_tokens, c.max_seq_len));
  }
  // Worst case blocks: every segment starts a block; the block baseline also copies.
  const int bs = backend_->block_size();
  const AttentionMode mode = request.mode.value_or(options_.mode);
  int64_t needed = CeilDiv(total + request.sampling.max_tokens, bs) + 2 + static_cast<int64_t>(request.docs.size());
  if (mode == AttentionMode::kBlock) {
    for (const auto& doc : request.docs) needed += CeilDiv(doc.size(), bs);
  }
  if (needed > backend_->num_blocks()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "request may need %d KV blocks of %d tokens; the pool holds %d", needed, bs, backend_->num_blocks()));
  }
  return absl::OkStatus();
}

absl::StatusOr<int32_t> Engine::AllocateBlock() {
  if (allocator_.num_free() == 0 && !index_.EvictUntilFree(1)) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "KV pool exhausted: all %d blocks are held by running sequences", allocator_.num_blocks()));
  }
  return *allocator_.Allocate();
}

absl::StatusOr<std::vector<float>> Engine::RunOwnTokens(Sequence& seq, std::span<const int32_t> tokens,
                                                        bool want_logits) {
  std::vector<std::vector<float>> logits;
  const int bs = backend_->block_size();
  for (size_t start = 0; start < tokens.size(); start += options_.max_prefill_tokens) {
    const auto piece = tokens.subspan(start, std::min<size_t>(options_.max_prefill_tokens, tokens.size() - start));
    for (size_t i = 0; i < piece.size(); ++i) {
      if (!seq.TailHasRoom(bs)) {
        ASSIGN_OR_RETURN(int32_t block, AllocateBlock());
        seq.AdoptEmptyOwnBlock(block);
      }
      seq.FillTailSlot();
    }
    const bool last = start + piece.size() == tokens.size();
    const SequenceStep step{piece, seq.table(), want_logits && last ? LogitsWanted::kLast : LogitsWanted::kNone};
    RETURN_IF_ERROR(backend_->Forward({&step, 1}, &logits));
  }
  if (!want_logits || logits.empty()) return std::vector<float>{};
  return std::move(logits[0]);
}

absl::StatusOr<std::vector<KvBlockRef>> Engine::AcquireChunk(const Hash128& key, std::span<const int32_t> tokens,
                                                             std::span<const KvBlockRef> context, int anchor_tokens,
                                                             const std::optional<TierHit>& hint, Usage& usage) {
  std::vector<KvBlockRef> blocks;
  if (const CachedKv* hit = index_.Lookup(key)) {
    blocks = hit->blocks;
    for (const KvBlockRef& ref : blocks) allocator_.Ref(ref.block);
    ++usage.chunk_hits;
    usage.cached_tokens += hit->num_tokens;
    usage.pool_tokens += hit->num_tokens;
    return blocks;
  }
  uint64_t lease_id = 0;
  if (options_.resolver) {
    ChunkResolver::Decision decision = options_.resolver->Resolve(key, hint);
    if (decision.fetched) {
      auto imported = ImportChunk(key, static_cast<int>(tokens.size()), anchor_tokens, decision.fetched->stored);
      if (imported.ok()) {
        for (const KvBlockRef& ref : *imported) allocator_.Ref(ref.block);  // the caller's reference
        ++usage.chunk_hits;
        usage.cached_tokens += static_cast<int>(tokens.size());
        (decision.fetched->source == ChunkSource::kDisk ? usage.disk_tokens : usage.host_tokens) +=
            static_cast<int>(tokens.size());
        usage.kv_bytes_fetched += decision.fetched->stored.size();
        return *std::move(imported);
      }
      if (imported.status().code() == absl::StatusCode::kResourceExhausted) return imported.status();
      // Unusable bytes (corrupt, another layout): compute the chunk instead.
      spdlog::error("fetched chunk {} is unusable, computing it: {}", key.ToHex(),
                    std::string(imported.status().message()));
    }
    lease_id = decision.lease_id;
  }
  // Encode alone after the context (the anchor), at local positions |context|.. .
  Sequence encoder(&allocator_);
  encoder.ShareBlocks(context);
  RETURN_IF_ERROR(RunOwnTokens(encoder, tokens, /*want_logits=*/false).status());
  blocks.assign(encoder.table().begin() + context.size(), encoder.table().end());
  index_.Insert(key, blocks);
  for (const KvBlockRef& ref : blocks) allocator_.Ref(ref.block);  // the caller's reference
  ++usage.chunk_misses;
  usage.computed_tokens += static_cast<int>(tokens.size());
  if (options_.resolver) PublishChunk(key, blocks, anchor_tokens, lease_id);
  return blocks;
}

std::vector<std::optional<TierHit>> Engine::LookUpInTier(std::span<const Hash128> keys) {
  std::vector<std::optional<TierHit>> hints(keys.size());
  if (!options_.resolver) return hints;
  std::vector<Hash128> missing;
  std::vector<size_t> where;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!index_.Contains(keys[i])) {
      missing.push_back(keys[i]);
      where.push_back(i);
    }
  }
  if (missing.empty()) return hints;
  const auto found = options_.resolver->Lookup(missing);
  for (size_t j = 0; j < where.size(); ++j) hints[where[j]] = found[j];
  return hints;
}

absl::StatusOr<std::vector<KvBlockRef>> Engine::ImportChunk(const Hash128& key, int num_tokens, int anchor_tokens,
                                                            const std::string& stored) {
  ASSIGN_OR_RETURN(const ChunkView chunk, DecodeChunk(stored));
  const ChunkLayout expected = MakeChunkLayout(config(), kv_dtype_, num_tokens, anchor_tokens);
  if (chunk.header.key != key || chunk.header.model_fingerprint != fingerprint_ || !(chunk.header.layout == expected)) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "fetched chunk does not fit this model: key %s, fingerprint %s, %d tokens after %d anchor tokens",
        chunk.header.key.ToHex(), chunk.header.model_fingerprint.ToHex(), chunk.header.layout.num_tokens,
        chunk.header.layout.anchor_tokens));
  }
  Sequence holder(&allocator_);  // gives the blocks back if the import fails
  const int bs = backend_->block_size();
  std::vector<KvBlockRef> blocks;
  for (int start = 0; start < num_tokens; start += bs) {
    ASSIGN_OR_RETURN(int32_t block, AllocateBlock());
    blocks.push_back(KvBlockRef{block, std::min(bs, num_tokens - start), 0});
    holder.AdoptBlocks({&blocks.back(), 1}, 0);
  }
  RETURN_IF_ERROR(backend_->ImportChunk(chunk.payload, blocks));
  index_.Insert(key, blocks);  // the index's reference outlives the holder's
  return blocks;
}

void Engine::PublishChunk(const Hash128& key, std::span<const KvBlockRef> blocks, int anchor_tokens,
                          uint64_t lease_id) {
  std::string payload;
  if (absl::Status s = backend_->ExportChunk(blocks, &payload); !s.ok()) {
    spdlog::error("cannot export chunk {} for publication: {}", key.ToHex(), std::string(s.message()));
    return;
  }
  int num_tokens = 0;
  for (const KvBlockRef& ref : blocks) num_tokens += ref.num_tokens;
  const ChunkHeader header =
      MakeChunkHeader(key, fingerprint_, MakeChunkLayout(config(), kv_dtype_, num_tokens, anchor_tokens), payload);
  options_.resolver->PublishAsync(key, fingerprint_, EncodeChunk(header, payload), lease_id);
}

absl::Status Engine::AttachChunk(Sequence& seq, AttentionMode mode, std::vector<KvBlockRef> chunk, int32_t delta,
                                 Usage& usage) {
  if (mode == AttentionMode::kLazy || delta == 0) {
    seq.AdoptBlocks(chunk, delta);  // zero-copy: the query is rotated by delta instead
    return absl::OkStatus();
  }
  // Block baseline: a re-rotated private copy. The source stays held until copied.
  Sequence source(&allocator_);
  source.AdoptBlocks(chunk, 0);
  std::vector<BlockCopy> copies;
  std::vector<KvBlockRef> copied;
  for (const KvBlockRef& ref : chunk) {
    ASSIGN_OR_RETURN(int32_t dst, AllocateBlock());
    copied.push_back(KvBlockRef{dst, ref.num_tokens, 0});
    copies.push_back(BlockCopy{ref.block, dst, ref.num_tokens, delta});
    usage.kv_bytes_copied += backend_->kv_bytes_per_block() / backend_->block_size() * ref.num_tokens;
  }
  seq.AdoptBlocks(copied, 0);
  return backend_->CopyBlocksRotated(copies);
}

absl::Status Engine::AttachCachedPrefix(Sequence& seq, std::span<const int32_t> tokens, Usage& usage,
                                        std::vector<Hash128>& block_keys) {
  const int bs = backend_->block_size();
  Hash128 parent = MakePrefixRootKey(fingerprint_);
  block_keys.clear();
  for (size_t b = 0; (b + 1) * bs <= tokens.size(); ++b) {
    parent = MakePrefixBlockKey(parent, tokens.subspan(b * bs, bs));
    block_keys.push_back(parent);
  }
  // Reuse whole blocks, and always leave the last token to compute (it yields the logits).
  const size_t reusable = (tokens.size() - 1) / bs;
  for (size_t b = 0; b < reusable; ++b) {
    const CachedKv* hit = index_.Lookup(block_keys[b]);
    if (hit == nullptr) break;
    seq.ShareBlocks(hit->blocks);
    usage.cached_tokens += bs;
  }
  return absl::OkStatus();
}

absl::StatusOr<GenerateResult> Engine::Generate(const GenerateRequest& request) {
  const auto start = std::chrono::steady_clock::now();
  auto seconds_since_start = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  RETURN_IF_ERROR(ValidateRequest(request));
  GenerateResult result;
  result.mode = request.mode.value_or(options_.mode);
  Usage& usage = result.usage;
  const std::vector<int32_t>& anchor = options_.anchor;
  auto& all = result.prompt_token_ids;
  all = anchor;
  for (const auto& doc : request.docs) all.insert(all.end(), doc.begin(), doc.end());
  all.insert(all.end(), request.prompt.begin(), request.prompt.end());
  usage.prompt_tokens = static_cast<int>(all.size());

  Sequence seq(&allocator_);
  std::vector<float> logits;
  switch (result.mode) {
    case AttentionMode::kNone: {
      ASSIGN_OR_RETURN(logits, RunOwnTokens(seq, all, true));
      usage.computed_tokens += static_cast<int>(all.size());
      break;
    }
    case AttentionMode::kPrefix: {
      std::vector<Hash128> block_keys;
      RETURN_IF_ERROR(AttachCachedPrefix(seq, all, usage, block_keys));
      const size_t reused = usage.cached_tokens;
      ASSIGN_OR_RETURN(logits, RunOwnTokens(seq, std::span(all).subspan(reused), true));
      usage.computed_tokens += static_cast<int>(all.size() - reused);
      // Publish the full blocks this request computed (the table is one block per bs tokens).
      for (size_t b = reused / backend_->block_size(); b < block_keys.size(); ++b) {
        index_.Insert(block_keys[b], {seq.table()[b]});
      }
      break;
    }
    case AttentionMode::kBlock:
    case AttentionMode::kLazy: {
      // The request's own tokens (computed with full attention) are the prompt; with an
      // empty prompt the last document, or with no documents either, the anchor.
      std::span<const int32_t> own = request.prompt;
      size_t shared_docs = request.docs.size();
      bool anchor_shared = true;
      if (own.empty() && shared_docs > 0) {
        own = request.docs[--shared_docs];
      } else if (own.empty()) {
        own = anchor;
        anchor_shared = false;
      }
      if (anchor_shared) {
        // One batched tier lookup for every shared chunk the local pool lacks.
        std::vector<Hash128> keys = {MakeAnchorKey(fingerprint_, anchor)};
        for (size_t d = 0; d < shared_docs; ++d) keys.push_back(MakeChunkKey(fingerprint_, anchor, request.docs[d]));
        const std::vector<std::optional<TierHit>> hints = LookUpInTier(keys);
        ASSIGN_OR_RETURN(auto anchor_blocks, AcquireChunk(keys[0], anchor, {}, 0, hints[0], usage));
        seq.AdoptBlocks(anchor_blocks, 0);
        const size_t anchor_entries = seq.table().size();
        int64_t position = static_cast<int64_t>(anchor.size());
        for (size_t d = 0; d < shared_docs; ++d) {
          const auto& doc = request.docs[d];
          if (doc.empty()) continue;
          const std::vector<KvBlockRef> anchor_context(seq.table().begin(), seq.table().begin() + anchor_entries);
          ASSIGN_OR_RETURN(auto chunk, AcquireChunk(keys[d + 1], doc, anchor_context, static_cast<int>(anchor.size()),
                                                    hints[d + 1], usage));
          RETURN_IF_ERROR(AttachChunk(seq, result.mode, std::move(chunk),
                                      static_cast<int32_t>(position - static_cast<int64_t>(anchor.size())), usage));
          position += static_cast<int64_t>(doc.size());
        }
      }
      ASSIGN_OR_RETURN(logits, RunOwnTokens(seq, own, true));
      usage.computed_tokens += static_cast<int>(own.size());
      break;
    }
  }

  SamplerRng rng(request.sampling.seed);
  result.finish_reason = "length";
  for (int step = 0; step < request.sampling.max_tokens; ++step) {
    if (request.record_logits) result.step_logits.push_back(logits);
    const SampledToken next = SampleToken(logits, request.sampling, rng);
    if (step == 0) result.ttft_seconds = seconds_since_start();
    if (next.id == config().eos_id) {
      result.finish_reason = "stop";
      break;
    }
    result.tokens.push_back(next.id);
    result.logprobs.push_back(next.logprob);
    if (step + 1 == request.sampling.max_tokens) break;
    const int32_t token = next.id;
    ASSIGN_OR_RETURN(logits, RunOwnTokens(seq, {&token, 1}, true));
  }
  result.total_seconds = seconds_since_start();
  if (request.sampling.max_tokens == 0) result.ttft_seconds = result.total_seconds;
  return result;
}

}  // namespace lazykv
