// Shared chunks: a request's anchor and documents come from the local pool, from the
// cache tier (looked up, fetched or leased off the scheduling thread), or are encoded
// here once for every request that waits for them; then they are attached to the
// request's sequence at their logical positions.
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"
#include "worker/engine/engine.h"
#include "worker/engine/engine_state.h"

namespace lazykv {

void Engine::PlanChunks(Request& r) {
  const GenerateRequest& in = r.input;
  const std::vector<int32_t>& anchor = options_.anchor;
  // The request's own tokens (computed with full attention) are the prompt; with an
  // empty prompt the last document, or with no documents either, the anchor. The chunks'
  // keys were made at submission (shared_chunks: the anchor, then each non-empty shared
  // document), for admission.
  const int shared_docs = SharedDocumentCount(in);
  if (shared_docs < 0) {
    r.own = anchor;
    return;
  }
  if (in.prompt.empty()) {
    r.own = in.docs.back();
    r.result.usage.document_computed_tokens += static_cast<int>(r.own.size());
  } else {
    r.own = in.prompt;
  }
  size_t next_key = 0;
  r.segments.push_back(ChunkSegment{.key = r.shared_chunks[next_key++].key,
                                    .tokens = anchor,
                                    .is_anchor = true,
                                    .delta = 0,
                                    .ready = false,
                                    .blocks = {}});
  int64_t position = static_cast<int64_t>(anchor.size());
  for (int d = 0; d < shared_docs; ++d) {
    if (in.docs[d].empty()) continue;
    r.segments.push_back(ChunkSegment{.key = r.shared_chunks[next_key++].key,
                                      .tokens = in.docs[d],
                                      .is_anchor = false,
                                      .delta = static_cast<int32_t>(position - static_cast<int64_t>(anchor.size())),
                                      .ready = false,
                                      .blocks = {}});
    position += static_cast<int64_t>(in.docs[d].size());
  }

  std::vector<ChunkJob*> new_jobs;
  for (size_t s = 0; s < r.segments.size(); ++s) {
    ChunkSegment& segment = r.segments[s];
    if (const CachedKv* hit = index_.Lookup(segment.key)) {
      const std::vector<KvBlockRef> blocks = hit->blocks;  // the entry may move on the next insert
      TakeChunk(r, s, blocks, ChunkSource::kPool, 0);
      continue;
    }
    ++r.segments_pending;
    auto [it, inserted] = jobs_.try_emplace(segment.key);
    if (inserted) {
      it->second = std::make_unique<ChunkJob>(&allocator_);
      ChunkJob& job = *it->second;
      job.key = segment.key;
      job.tokens.assign(segment.tokens.begin(), segment.tokens.end());
      job.is_anchor = segment.is_anchor;
      job.state = options_.resolver ? ChunkJob::State::kLookup : ChunkJob::State::kEncode;
      new_jobs.push_back(&job);
    }
    ChunkJob& job = *it->second;
    if (job.owner == 0) job.owner = r.id;
    job.waiters.emplace_back(r.id, s);
  }
  if (!new_jobs.empty() && options_.resolver) {
    // One batched lookup for every key this request is first to miss.
    auto lookup = std::make_shared<TierLookup>();
    for (ChunkJob* job : new_jobs) {
      job->lookup = lookup;
      job->lookup_index = lookup->keys.size();
      lookup->keys.push_back(job->key);
    }
    lookup->pending = std::async(
        std::launch::async, [resolver = options_.resolver, keys = lookup->keys] { return resolver->Lookup(keys); });
    lookups_.push_back(std::move(lookup));
  }
  if (r.segments_pending == 0) {
    if (absl::Status s = AttachSegments(r); !s.ok()) {
      // Attach only fails on a full pool, which admission rules out: report it loudly.
      spdlog::error("request {}: {}", r.id, s.ToString());
      Fail(r, s, &pending_events_);
    }
  } else {
    r.phase = Request::Phase::kChunks;
  }
}

void Engine::TakeChunk(Request& r, size_t s, std::span<const KvBlockRef> blocks, ChunkSource source,
                       uint64_t fetched_bytes) {
  ChunkSegment& segment = r.segments[s];
  for (const KvBlockRef& ref : blocks) allocator_.Ref(ref.block);
  segment.blocks.assign(blocks.begin(), blocks.end());
  segment.ready = true;
  const int n = static_cast<int>(segment.tokens.size());
  Usage& u = r.result.usage;
  if (source == ChunkSource::kComputed) {
    ++u.chunk_misses;
    u.computed_tokens += n;
    if (!segment.is_anchor) u.document_computed_tokens += n;
    return;
  }
  ++u.chunk_hits;
  u.cached_tokens += n;
  if (!segment.is_anchor) u.document_cached_tokens += n;
  (source == ChunkSource::kPool ? u.pool_tokens : source == ChunkSource::kDisk ? u.disk_tokens : u.host_tokens) += n;  // TODO(pipeline): remote
  u.kv_bytes_fetched += fetched_bytes;
}

absl::Status Engine::AttachSegments(Request& r) {
  for (ChunkSegment& segment : r.segments) {
    if (segment.is_anchor) {
      r.seq.AdoptBlocks(segment.blocks, 0);
    } else {
      RETURN_IF_ERROR(AttachChunk(r.seq, r.result.mode, segment.blocks, segment.delta, r.result.usage));
    }
    segment.blocks.clear();
  }
  r.segments_attached = true;
  r.phase = Request::Phase::kPrefill;
  return absl::OkStatus();
}

absl::Status Engine::AttachChunk(KvSequence& seq, AttentionMode mode, std::span<const KvBlockRef> chunk, int32_t delta,
                                 Usage& usage) {
  if (mode == AttentionMode::kLazy || delta == 0) {
    seq.AdoptBlocks(chunk, delta);  // zero-copy: the query is rotated by delta instead
    return absl::OkStatus();
  }
  // Block baseline: a re-rotated private copy. The source stays held until copied.
  KvSequence source(&allocator_);
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

void Engine::AdvanceChunkJobs(std::vector<EngineEvent>* events) {
  for (auto& lookup : lookups_) {
    if (!lookup->done && IsReady(lookup->pending)) {
      lookup->answers = lookup->pending.get();
      lookup->done = true;
    }
  }
  std::erase_if(lookups_, [](const auto& lookup) { return lookup->done; });

  std::vector<Hash128> keys;
  for (const auto& [key, job] : jobs_) keys.push_back(key);
  for (const Hash128& key : keys) {
    auto it = jobs_.find(key);
    if (it == jobs_.end()) continue;  // dropped while another job completed
    ChunkJob& job = *it->second;
    if (job.state == ChunkJob::State::kLookup && job.lookup->done) {
      if (job.waiters.empty()) {  // every requester went away while the tier answered
        jobs_.erase(it);
        continue;
      }
      const std::optional<TierHit> hint = job.lookup->answers[job.lookup_index];
      job.lookup.reset();
      job.state = ChunkJob::State::kResolve;
      job.decision = std::async(std::launch::async,
                                [resolver = options_.resolver, key, hint] { return resolver->Resolve(key, hint); });
    }
    if (job.state == ChunkJob::State::kResolve && IsReady(job.decision)) {
      ChunkResolver::Decision decision = job.decision.get();
      job.state = ChunkJob::State::kEncode;
      job.lease_id = decision.lease_id;
      if (job.waiters.empty()) {  // every requester went away while the tier answered
        if (job.lease_id != 0) options_.resolver->tier().ReleaseLease(key, job.lease_id);
        jobs_.erase(it);
        continue;
      }
      if (decision.fetched) {
        const int anchor_tokens = job.is_anchor ? 0 : static_cast<int>(options_.anchor.size());
        auto imported = ImportChunk(key, static_cast<int>(job.tokens.size()), anchor_tokens, decision.fetched->stored.ToString());
        if (imported.ok()) {
          CompleteJob(job, *imported, decision.fetched->source, decision.fetched->stored.size(), events);
          continue;
        }
        if (imported.status().code() == absl::StatusCode::kResourceExhausted) {
          FailJob(job, imported.status(), events);
          continue;
        }
        // Unusable bytes (corrupt, another layout): compute the chunk instead.
        spdlog::error("fetched chunk {} is unusable, computing it: {}", key.ToHex(),
                      std::string(imported.status().message()));
      }
    }
    if (job.state == ChunkJob::State::kEncode && !job.context_set) {
      if (job.is_anchor) {
        job.context_set = true;
        continue;
      }
      // A document is encoded after the anchor: borrow a waiter's anchor blocks.
      for (const auto& [id, segment] : job.waiters) {
        const ChunkSegment& anchor = running_.at(id)->segments[0];
        if (anchor.ready) {
          job.encoder.ShareBlocks(anchor.blocks);
          job.context_entries = job.encoder.table().size();
          job.context_set = true;
          break;
        }
      }
    }
  }
}

void Engine::CompleteJob(ChunkJob& job, std::span<const KvBlockRef> blocks, ChunkSource source, uint64_t fetched_bytes,
                         std::vector<EngineEvent>* events) {
  auto node = jobs_.extract(job.key);  // keeps the job alive while its waiters move on
  const std::vector<KvBlockRef> chunk(blocks.begin(), blocks.end());
  for (const auto& [id, s] : job.waiters) {
    Request& r = *running_.at(id);
    if (id == job.owner) {
      TakeChunk(r, s, chunk, source, fetched_bytes);
    } else {
      TakeChunk(r, s, chunk, ChunkSource::kPool, 0);
    }
    if (--r.segments_pending == 0) {
      if (absl::Status status = AttachSegments(r); !status.ok()) Fail(r, status, events);
    }
  }
}

void Engine::FailJob(ChunkJob& job, const absl::Status& status, std::vector<EngineEvent>* events) {
  auto node = jobs_.extract(job.key);
  if (job.lease_id != 0) options_.resolver->tier().ReleaseLease(job.key, job.lease_id);
  const auto waiters = std::move(job.waiters);
  job.waiters.clear();
  for (const auto& [id, s] : waiters) {
    auto it = running_.find(id);
    if (it != running_.end()) Fail(*it->second, status, events);
  }
}

void Engine::DropWaiter(Request& r) {
  for (const ChunkSegment& segment : r.segments) {
    if (segment.ready) continue;
    auto it = jobs_.find(segment.key);
    if (it == jobs_.end()) continue;
    ChunkJob& job = *it->second;
    std::erase_if(job.waiters, [&](const auto& waiter) { return waiter.first == r.id; });
    if (job.owner == r.id) job.owner = job.waiters.empty() ? 0 : job.waiters.front().first;
    if (!job.waiters.empty()) continue;
    if (job.state == ChunkJob::State::kEncode) {
      // Nobody needs it any more: free its blocks now and let another worker take the lease.
      if (job.lease_id != 0) options_.resolver->tier().ReleaseLease(job.key, job.lease_id);
      jobs_.erase(it);
    }
    // A job still waiting on the tier stays until the answer comes (AdvanceChunkJobs).
  }
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
  KvSequence holder(&allocator_);  // gives the blocks back if the import fails
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
    if (lease_id != 0) options_.resolver->tier().ReleaseLease(key, lease_id);
    return;
  }
  int num_tokens = 0;
  for (const KvBlockRef& ref : blocks) num_tokens += ref.num_tokens;
  const ChunkHeader header =
      MakeChunkHeader(key, fingerprint_, MakeChunkLayout(config(), kv_dtype_, num_tokens, anchor_tokens), payload);
  options_.resolver->PublishAsync(key, fingerprint_, EncodeChunk(header, payload), lease_id);
}

// Prefix caching: reuse whole blocks of the longest cached prefix (a chain of block
// keys from position 0), and always leave the last token to compute (it yields the
// logits).
void Engine::AttachCachedPrefix(Request& r) {
  const std::vector<int32_t>& all = r.result.prompt_token_ids;
  const size_t bs = backend_->block_size();
  Hash128 parent = MakePrefixRootKey(fingerprint_);
  for (size_t b = 0; (b + 1) * bs <= all.size(); ++b) {
    parent = MakePrefixBlockKey(parent, std::span(all).subspan(b * bs, bs));
    r.prefix_keys.push_back(parent);
  }
  const size_t reusable = (all.size() - 1) / bs;
  Usage& u = r.result.usage;
  for (size_t b = 0; b < reusable; ++b) {
    const CachedKv* hit = index_.Lookup(r.prefix_keys[b]);
    if (hit == nullptr) break;
    r.seq.ShareBlocks(hit->blocks);
    ++r.prefix_reused_blocks;
  }
  const size_t reused = r.prefix_reused_blocks * bs;
  u.cached_tokens += static_cast<int>(reused);
  u.pool_tokens += static_cast<int>(reused);
  const int64_t anchor = static_cast<int64_t>(options_.anchor.size());
  u.document_cached_tokens = static_cast<int>(std::clamp<int64_t>(reused - anchor, 0, u.document_tokens));
  u.document_computed_tokens = u.document_tokens - u.document_cached_tokens;
  r.own.assign(all.begin() + reused, all.end());
}

}  // namespace lazykv
