// The engine's per-request and per-chunk state (worker/engine/engine.h's private types),
// shared by engine.cc (admission), engine_chunks.cc (shared chunks) and engine_step.cc
// (batches).
#pragma once

#include <chrono>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "worker/engine/engine.h"

namespace lazykv {

using SteadyClock = std::chrono::steady_clock;

inline double SecondsBetween(SteadyClock::time_point from, SteadyClock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

// One shared chunk of a request (the anchor or a document), in logical order.
struct ChunkSegment {
  Hash128 key;
  std::span<const int32_t> tokens;  // into the request's documents, or the engine's anchor
  bool is_anchor = false;           // else a document
  bool repeat = false;              // a document this request already holds earlier
  int32_t delta = 0;                // logical position minus the position it was encoded at
  bool ready = false;
  // Repair: the chunk's first `repair` tokens are the request's own tokens, computed in
  // context before the rest of the chunk is attached (0: the whole chunk is reused).
  int repair = 0;
  bool repair_queued = false;  // its repaired tokens were made ready to run
  // Once ready: the chunk's blocks, one reference each held by the request until the
  // segments are attached to its sequence.
  std::vector<KvBlockRef> blocks;
};

// Lazy and block modes: the request's first SharedDocumentCount() documents are shared
// chunks (with an empty prompt the last document is its own tokens); -1 when it has no
// chunks at all (no prompt, no documents: its own tokens are the anchor).
int SharedDocumentCount(const GenerateRequest& request);

// Per shared document (the first SharedDocumentCount(request)), the tokens the repair
// computes in context: min(repair_tokens, its size), except 0 for the first non-empty one
// (it follows the anchor, or starts the sequence, exactly as when it was encoded alone).
std::vector<int> RepairPerDocument(const GenerateRequest& request, int shared_docs);

// For each of `docs`, whether it is the first occurrence of its tokens in the list. A
// document repeated within one request is one document: it is reserved once and counted
// once in the document usage (document tokens, hits, misses, cached documents), though its
// KV fills each of its positions.
std::vector<bool> FirstOccurrences(const std::vector<std::vector<int32_t>>& docs);

struct Engine::Request {
  explicit Request(KvBlockAllocator* allocator) : seq(allocator) {}

  enum class Phase { kQueued, kChunks, kPrefill, kDecode };

  RequestId id = 0;
  GenerateRequest input;
  GenerateResult result;                                      // filled as the request runs
  SteadyClock::time_point arrived;                            // GenerateRequest::arrival, or Submit's time
  int reserved_blocks = 0;                                    // private worst case (admission)
  std::vector<SharedChunkReservations::Chunk> shared_chunks;  // reserved once per chunk while running
  Phase phase = Phase::kQueued;

  std::vector<ChunkSegment> segments;  // lazy and block modes
  std::vector<bool> first_occurrence;  // per input document: FirstOccurrences(input.docs)
  size_t segments_pending = 0;
  // Segments are attached to the sequence in order; a repaired segment stops the walk
  // until its own tokens are computed (AttachReadySegments).
  size_t segments_attached = 0;

  KvSequence seq;
  // Tokens this request prefills itself: the repaired tokens of each repaired segment in
  // order, then the prompt (or, with an empty prompt, the last document; or the anchor).
  std::vector<int32_t> own;
  size_t own_done = 0;
  size_t own_ready = 0;  // own[0, own_ready) have their context attached: prefill may run them
  std::vector<Hash128> prefix_keys;  // prefix mode: the chain of full-block keys
  size_t prefix_reused_blocks = 0;

  std::optional<SamplerRng> rng;
  int32_t next_input = 0;  // decoding: the token fed at the next step
};

// A chunk missing from the pool: looked up in the tier, fetched or leased there, and
// otherwise encoded here once for every request that waits for it.
struct Engine::ChunkJob {
  explicit ChunkJob(KvBlockAllocator* allocator) : encoder(allocator) {}

  enum class State { kTier, kEncode };  // waiting for the chunk pipeline's outcome, or encoding

  Hash128 key;
  std::vector<int32_t> tokens;
  bool is_anchor = false;
  State state = State::kEncode;
  uint64_t lease_id = 0;   // publish under this lease once encoded
  bool publish = true;     // false: the tier holds it already
  bool recompute = false;  // the tier held it, but it is computed here (not a miss)

  KvSequence encoder;  // the anchor's blocks (context), then the chunk's own
  bool context_set = false;
  size_t context_entries = 0;
  size_t encoded = 0;  // tokens run so far

  // The request whose usage counts the computation or fetch (0: none left); the other
  // waiters reuse the result from the pool.
  RequestId owner = 0;
  std::vector<std::pair<RequestId, size_t>> waiters;  // request, segment index
};

// Prefill tokens for one forward pass: a piece of a chunk being encoded or of a
// request's own tokens.
struct Engine::PrefillWork {
  Request* request = nullptr;
  ChunkJob* job = nullptr;
  size_t count = 0;
};

}  // namespace lazykv
