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
  // keys were made at submission (shared_chunks: the anchor unless anchorless, then each
  // non-empty shared document), for admission.
  const int shared_docs = SharedDocumentCount(in);
  if (shared_docs < 0) {
    r.own = anchor;
    r.own_ready = r.own.size();
    return;
  }
  // Own tokens: each repaired document's first tokens, in order, then the prompt.
  const std::vector<int> repair = RepairPerDocument(in, shared_docs);
  for (int d = 0; d < shared_docs; ++d) {
    r.own.insert(r.own.end(), in.docs[d].begin(), in.docs[d].begin() + repair[d]);
    r.result.usage.repaired_tokens += repair[d];
  }
  if (in.prompt.empty()) {
    r.own.insert(r.own.end(), in.docs.back().begin(), in.docs.back().end());
    if (r.first_occurrence.back()) r.result.usage.document_computed_tokens += static_cast<int>(in.docs.back().size());
  } else {
    r.own.insert(r.own.end(), in.prompt.begin(), in.prompt.end());
  }
  size_t next_key = 0;
  if (!anchor.empty()) {
    r.segments.push_back(ChunkSegment{.key = r.shared_chunks[next_key++].key,
                                      .tokens = anchor,
                                      .is_anchor = true,
                                      .delta = 0,
                                      .ready = false,
                                      .blocks = {}});
  }
  int64_t position = static_cast<int64_t>(anchor.size());
  for (int d = 0; d < shared_docs; ++d) {
    if (in.docs[d].empty()) continue;
    r.segments.push_back(ChunkSegment{.key = r.shared_chunks[next_key++].key,
                                      .tokens = in.docs[d],
                                      .is_anchor = false,
                                      .repeat = !r.first_occurrence[d],
                                      .delta = static_cast<int32_t>(position - static_cast<int64_t>(anchor.size())),
                                      .ready = false,
                                      .repair = repair[d],
                                      .blocks = {}});
    position += static_cast<int64_t>(in.docs[d].size());
  }

  std::vector<ChunkPipeline::ChunkRequest> new_chunks;
  const int anchor_tokens = static_cast<int>(anchor.size());
  for (size_t s = 0; s < r.segments.size(); ++s) {
    ChunkSegment& segment = r.segments[s];
    if (const CachedKv* hit = index_.Lookup(segment.key)) {
      const std::vector<KvBlockRef> blocks = hit->blocks;  // the entry may move on the next insert
      TakeChunk(r, s, blocks, ChunkSource::kPool, 0, false);
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
      job.state = pipeline_ ? ChunkJob::State::kTier : ChunkJob::State::kEncode;
      if (pipeline_) {
        new_chunks.push_back(ChunkPipeline::ChunkRequest{.key = job.key,
                                                         .num_tokens = static_cast<int>(job.tokens.size()),
                                                         .anchor_tokens = job.is_anchor ? 0 : anchor_tokens});
      }
    }
    ChunkJob& job = *it->second;
    if (job.owner == 0) job.owner = r.id;
    job.waiters.emplace_back(r.id, s);
  }
  // One batched lookup for every key this request is first to miss.
  if (pipeline_) pipeline_->Request(std::move(new_chunks));
  if (r.segments_pending == 0) {
    if (absl::Status s = AttachReadySegments(r); !s.ok()) {
      // Attach only fails on a full pool, which admission rules out: report it loudly.
      spdlog::error("request {}: {}", r.id, s.ToString());
      Fail(r, s, &pending_events_);
    }
  } else {
    r.phase = Request::Phase::kChunks;
  }
}

void Engine::TakeChunk(Request& r, size_t s, std::span<const KvBlockRef> blocks, ChunkSource source,
                       uint64_t fetched_bytes, bool recomputed) {
  ChunkSegment& segment = r.segments[s];
  for (const KvBlockRef& ref : blocks) allocator_.Ref(ref.block);
  segment.blocks.assign(blocks.begin(), blocks.end());
  segment.ready = true;
  const int n = static_cast<int>(segment.tokens.size());
  Usage& u = r.result.usage;
  // A repeat's positions count by where their KV came from; as a document it was counted
  // at its first occurrence.
  const bool counts_as_document = !segment.is_anchor && !segment.repeat;
  if (source == ChunkSource::kComputed) {
    u.computed_tokens += n;
    if (segment.repeat) return;
    if (counts_as_document) u.document_computed_tokens += n;
    if (recomputed) {
      ++u.chunk_recomputes;
      u.recomputed_tokens += n;
    } else {
      ++u.chunk_misses;
    }
    return;
  }
  if (!segment.repeat) ++u.chunk_hits;
  u.cached_tokens += n;
  if (counts_as_document) {
    u.document_cached_tokens += n;
    ++u.cached_documents;
  }
  u.kv_bytes_fetched += fetched_bytes;
  switch (source) {
    case ChunkSource::kHost:
      u.host_tokens += n;
      u.host_bytes_fetched += fetched_bytes;
      break;
    case ChunkSource::kDisk:
      u.disk_tokens += n;
      u.disk_bytes_fetched += fetched_bytes;
      break;
    case ChunkSource::kRemote:
      u.remote_tokens += n;
      u.remote_bytes_fetched += fetched_bytes;
      break;
    default:
      u.pool_tokens += n;
      break;
  }
}

absl::Status Engine::AttachReadySegments(Request& r) {
  // The block baseline's moved documents are copied now; the request holds the copies
  // (reserved privately) and lets go of the sources, so their reservation goes too.
  std::vector<SharedChunkReservations::Chunk> copied_sources;
  while (r.segments_attached < r.segments.size()) {
    ChunkSegment& segment = r.segments[r.segments_attached];
    size_t first_reused = 0;  // the chunk's first block attached as it is
    if (segment.repair > 0) {
      if (!segment.repair_queued) {
        // Its first tokens run as own tokens first, after everything attached so far.
        segment.repair_queued = true;
        r.own_ready += static_cast<size_t>(segment.repair);
        break;
      }
      if (r.own_done < r.own_ready) break;  // they are still running
      ASSIGN_OR_RETURN(first_reused, AttachRepairedHead(r, segment));
    }
    const auto rest = std::span<const KvBlockRef>(segment.blocks).subspan(first_reused);
    if (segment.is_anchor) {
      r.seq.AdoptBlocks(rest, 0);
    } else {
      RETURN_IF_ERROR(AttachChunk(r.seq, r.result.mode, rest, segment.delta, r.result.usage));
    }
    if (!segment.is_anchor && r.result.mode == AttentionMode::kBlock && segment.delta != 0) {
      // One entry per occurrence: a document repeated at delta 0 keeps its other one.
      auto it = std::ranges::find_if(r.shared_chunks, [&](const auto& chunk) { return chunk.key == segment.key; });
      if (it != r.shared_chunks.end()) {
        copied_sources.push_back(*it);
        r.shared_chunks.erase(it);
      }
    }
    segment.blocks.clear();
    ++r.segments_attached;
  }
  shared_reservations_.Remove(copied_sources);
  if (r.segments_attached == r.segments.size()) r.own_ready = r.own.size();
  r.phase = Request::Phase::kPrefill;
  return absl::OkStatus();
}

absl::StatusOr<size_t> Engine::AttachRepairedHead(Request& r, const ChunkSegment& segment) {
  // The own tail holds the chunk's first `repair` tokens, computed in context. The rest of
  // the chunk block they end in is copied after them (keys re-rotated to the own block's delta
  // 0, as the block baseline does); the chunk's blocks from the next one on are attached
  // as usual. Every block before that is let go once the copy is enqueued.
  const int bs = backend_->block_size();
  const size_t whole = static_cast<size_t>(segment.repair / bs);
  const int32_t cut = segment.repair % bs;
  const size_t first_reused = whole + (cut > 0 ? 1 : 0);
  KvSequence replaced(&allocator_);  // releases the replaced blocks after the copy
  replaced.AdoptBlocks(std::span<const KvBlockRef>(segment.blocks).first(std::min(first_reused, segment.blocks.size())),
                       0);
  int32_t copied = 0;
  if (cut > 0 && whole < segment.blocks.size() && segment.blocks[whole].num_tokens > cut) {
    const KvBlockRef& source = segment.blocks[whole];
    RETURN_IF_ERROR(backend_->CopyBlocksRotated(std::vector<BlockCopy>{{.src_block = source.block,
                                                                        .dst_block = r.seq.table().back().block,
                                                                        .num_tokens = source.num_tokens,
                                                                        .delta = segment.delta,
                                                                        .first_slot = cut}}));
    copied = source.num_tokens - cut;
    r.result.usage.kv_bytes_copied += backend_->kv_bytes_per_block() / bs * static_cast<uint64_t>(copied);
  }
  // The next own tokens (another document's head, the prompt) start a new block, as
  // admission counts them.
  r.seq.EndOwnRun(copied);
  return first_reused;
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
  ASSIGN_OR_RETURN(const std::vector<int32_t> ids, AllocateBlocks(static_cast<int>(chunk.size())));
  for (size_t i = 0; i < chunk.size(); ++i) {
    const KvBlockRef& ref = chunk[i];
    const int32_t dst = ids[i];
    copied.push_back(KvBlockRef{dst, ref.num_tokens, 0});
    copies.push_back(BlockCopy{ref.block, dst, ref.num_tokens, delta});
    usage.kv_bytes_copied += backend_->kv_bytes_per_block() / backend_->block_size() * ref.num_tokens;
  }
  seq.AdoptBlocks(copied, 0);
  return backend_->CopyBlocksRotated(copies);
}

void Engine::AdvanceChunkJobs(std::vector<EngineEvent>* events) {
  if (pipeline_) {
    for (ChunkOutcome& outcome : pipeline_->Poll()) TakeOutcome(std::move(outcome), events);
  }
  for (auto& [key, job] : jobs_) {
    if (job->state != ChunkJob::State::kEncode || job->context_set) continue;
    if (job->is_anchor || options_.anchor.empty()) {  // encoded from position 0, alone
      job->context_set = true;
      continue;
    }
    // A document is encoded after the anchor: borrow a waiter's anchor blocks.
    for (const auto& [id, segment] : job->waiters) {
      const ChunkSegment& anchor = running_.at(id)->segments[0];
      if (anchor.ready) {
        job->encoder.ShareBlocks(anchor.blocks);
        job->context_entries = job->encoder.table().size();
        job->context_set = true;
        break;
      }
    }
  }
}

void Engine::TakeOutcome(ChunkOutcome outcome, std::vector<EngineEvent>* events) {
  auto it = jobs_.find(outcome.key);
  if (it == jobs_.end() || it->second->state != ChunkJob::State::kTier) {
    // Not asked for (cannot happen): give a lease back so others are not held up.
    if (outcome.lease_id != 0) pipeline_->ReleaseLease(outcome.key, outcome.lease_id);
    return;
  }
  ChunkJob& job = *it->second;
  if (job.waiters.empty()) {  // every requester went away while the tier answered
    if (outcome.lease_id != 0) pipeline_->ReleaseLease(job.key, outcome.lease_id);
    jobs_.erase(it);
    return;
  }
  if (outcome.fetched) {
    auto imported = ImportChunk(job.key, static_cast<int>(job.tokens.size()), std::move(outcome.staged));
    if (imported.ok()) {
      CompleteJob(job, *imported, outcome.source, outcome.stored_bytes, events);
      return;
    }
    if (imported.status().code() == absl::StatusCode::kResourceExhausted) {
      FailJob(job, imported.status(), events);
      return;
    }
    // The backend refused the staged bytes: compute the chunk instead.
    spdlog::error("fetched chunk {} is unusable, computing it: {}", job.key.ToHex(), imported.status().ToString());
    outcome.reason = ComputeReason::kFailed;
    outcome.publish = false;
  }
  job.state = ChunkJob::State::kEncode;
  job.lease_id = outcome.lease_id;
  job.publish = outcome.publish;
  job.recompute = outcome.reason == ComputeReason::kChosen || outcome.reason == ComputeReason::kFailed;
}

void Engine::CompleteJob(ChunkJob& job, std::span<const KvBlockRef> blocks, ChunkSource source, uint64_t fetched_bytes,
                         std::vector<EngineEvent>* events) {
  auto node = jobs_.extract(job.key);  // keeps the job alive while its waiters move on
  const std::vector<KvBlockRef> chunk(blocks.begin(), blocks.end());
  bool owner_counted = false;  // a document repeated within a request is fetched or computed once
  for (const auto& [id, s] : job.waiters) {
    Request& r = *running_.at(id);
    if (id == job.owner && !owner_counted) {
      owner_counted = true;
      TakeChunk(r, s, chunk, source, fetched_bytes, job.recompute);
    } else {
      TakeChunk(r, s, chunk, ChunkSource::kPool, 0, false);
    }
    if (--r.segments_pending == 0) {
      if (absl::Status status = AttachReadySegments(r); !status.ok()) Fail(r, status, events);
    }
  }
}

void Engine::FailJob(ChunkJob& job, const absl::Status& status, std::vector<EngineEvent>* events) {
  auto node = jobs_.extract(job.key);
  if (job.lease_id != 0) pipeline_->ReleaseLease(job.key, job.lease_id);
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
      if (job.lease_id != 0) pipeline_->ReleaseLease(job.key, job.lease_id);
      jobs_.erase(it);
    }
    // A job still waiting on the tier stays until the answer comes (AdvanceChunkJobs).
  }
}

absl::StatusOr<std::vector<KvBlockRef>> Engine::ImportChunk(const Hash128& key, int num_tokens,
                                                            std::unique_ptr<StagedChunk> staged) {
  KvSequence holder(&allocator_);  // gives the blocks back if the import fails
  const int bs = backend_->block_size();
  std::vector<KvBlockRef> blocks;
  ASSIGN_OR_RETURN(const std::vector<int32_t> ids, AllocateBlocks((num_tokens + bs - 1) / bs));
  for (size_t i = 0; i < ids.size(); ++i) {
    const int start = static_cast<int>(i) * bs;
    blocks.push_back(KvBlockRef{ids[i], std::min(bs, num_tokens - start), 0});
  }
  holder.AdoptBlocks(blocks, 0);
  RETURN_IF_ERROR(backend_->ImportStaged(std::move(staged), blocks));
  index_.Insert(key, blocks);  // the index's reference outlives the holder's
  return blocks;
}

void Engine::PublishChunk(const Hash128& key, std::span<const KvBlockRef> blocks, int anchor_tokens,
                          uint64_t lease_id) {
  int num_tokens = 0;
  for (const KvBlockRef& ref : blocks) num_tokens += ref.num_tokens;
  const ChunkLayout layout = MakeChunkLayout(config(), kv_dtype_, num_tokens, anchor_tokens);
  if (!pipeline_->TryReservePublish(key, layout.payload_bytes(), lease_id)) return;  // dropped, counted
  // Enqueued only: the blocks may be reused at once, and the bytes leave on the pipeline.
  auto captured = backend_->CaptureChunk(blocks);
  if (!captured.ok()) {
    // Staging full is backpressure (counted as a drop), not a fault.
    if (captured.status().code() == absl::StatusCode::kResourceExhausted) {
      spdlog::debug("cannot capture chunk {} for publication: {}", key.ToHex(), captured.status().ToString());
    } else {
      spdlog::warn("cannot capture chunk {} for publication: {}", key.ToHex(), captured.status().ToString());
    }
    pipeline_->CancelPublish(key, layout.payload_bytes(), lease_id);
    return;
  }
  pipeline_->Publish(key, layout, lease_id, *std::move(captured));
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
  // Each document (a repeat counted at its first occurrence) is cached for the part of it
  // inside the reused prefix.
  int64_t doc_start = static_cast<int64_t>(options_.anchor.size());
  for (size_t d = 0; d < r.input.docs.size(); ++d) {
    const int64_t doc_end = doc_start + static_cast<int64_t>(r.input.docs[d].size());
    if (r.first_occurrence[d]) {
      u.document_cached_tokens +=
          static_cast<int>(std::clamp<int64_t>(static_cast<int64_t>(reused) - doc_start, 0, doc_end - doc_start));
      if (doc_end > doc_start && doc_end <= static_cast<int64_t>(reused)) ++u.cached_documents;
    }
    doc_start = doc_end;
  }
  u.document_computed_tokens = u.document_tokens - u.document_cached_tokens;
  r.own.assign(all.begin() + reused, all.end());
}

}  // namespace lazykv
