// The generation engine: resolves each request's documents to KV according to the
// attention mode, prefills the rest, and decodes. It plans block tables over the
// paged pool and drives a Backend; it does not know which device runs.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/chunk_key.h"
#include "worker/attention_mode.h"
#include "worker/backend.h"
#include "worker/chunk_resolver.h"
#include "worker/kv_block_allocator.h"
#include "worker/kv_cache_index.h"
#include "worker/sampler.h"

namespace lazykv {

struct EngineOptions {
  AttentionMode mode = AttentionMode::kLazy;
  // Tokens every sequence starts with and every chunk is encoded after (DESIGN.md
  // section 2). Empty: the model's BOS token.
  std::vector<int32_t> anchor;
  // At most this many of a request's own tokens go through one forward call.
  int max_prefill_tokens = 512;
  // The cache tier behind the local pool (null: the local pool only). Shared chunks and
  // the anchor are looked up there, computed under its lease, and published to it.
  std::shared_ptr<ChunkResolver> resolver;
};

struct GenerateRequest {
  std::vector<std::vector<int32_t>> docs;
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  std::optional<AttentionMode> mode;  // overrides EngineOptions::mode
  bool record_logits = false;         // keep each decoding step's logits (tests)
};

struct Usage {
  int prompt_tokens = 0;    // the whole logical prompt: anchor, documents, prompt
  int cached_tokens = 0;    // of those, tokens whose KV was reused (pool + host + disk)
  int computed_tokens = 0;  // of those, tokens whose KV this request computed
  int pool_tokens = 0;      // reused tokens found in the local KV pool
  int host_tokens = 0;      // reused tokens fetched from the cache tier's host RAM
  int disk_tokens = 0;      // reused tokens fetched from the cache tier's disk
  int chunk_hits = 0;       // documents (and the anchor) reused, from any source
  int chunk_misses = 0;     // documents (and the anchor) encoded by this request
  uint64_t kv_bytes_copied = 0;   // KV bytes written to reuse chunks (the block baseline's copies)
  uint64_t kv_bytes_fetched = 0;  // chunk bytes fetched from the cache tier
};

struct GenerateResult {
  AttentionMode mode = AttentionMode::kLazy;
  std::vector<int32_t> prompt_token_ids;  // anchor, documents, prompt
  std::vector<int32_t> tokens;            // generated, EOS excluded
  std::vector<float> logprobs;
  std::string finish_reason;  // "stop" (EOS) or "length" (max_tokens)
  Usage usage;
  std::vector<std::vector<float>> step_logits;  // when record_logits
  double ttft_seconds = 0;   // request start to the first sampled token
  double total_seconds = 0;  // request start to the end of decoding
};

struct EngineStats {
  int num_blocks = 0;
  int free_blocks = 0;
  size_t cached_entries = 0;
  size_t cached_blocks = 0;
  uint64_t evictions = 0;
};

class Engine {
 public:
  static absl::StatusOr<std::unique_ptr<Engine>> Create(std::unique_ptr<Backend> backend, EngineOptions options);

  absl::StatusOr<GenerateResult> Generate(const GenerateRequest& request);

  const ModelConfig& config() const { return backend_->config(); }
  const Hash128& model_fingerprint() const { return fingerprint_; }
  const std::vector<int32_t>& anchor() const { return options_.anchor; }
  ChunkResolver* resolver() const { return options_.resolver.get(); }
  EngineStats stats() const;

 private:
  class Sequence;
  Engine(std::unique_ptr<Backend> backend, EngineOptions options, Hash128 fingerprint, KvDtype kv_dtype);

  absl::Status ValidateRequest(const GenerateRequest& request) const;
  absl::StatusOr<int32_t> AllocateBlock();
  // Finds `tokens`' KV in the pool, fetches it from the cache tier, or encodes it after
  // `context` (the anchor, `anchor_tokens` long); returns its blocks with one reference
  // taken for the caller. `hint`: the tier's answer from the request's batched lookup.
  absl::StatusOr<std::vector<KvBlockRef>> AcquireChunk(const Hash128& key, std::span<const int32_t> tokens,
                                                       std::span<const KvBlockRef> context, int anchor_tokens,
                                                       const std::optional<TierHit>& hint, Usage& usage);
  // The cache tier's answers, in one batched call, for the keys the local pool lacks
  // (nullopt for the others, or without a tier).
  std::vector<std::optional<TierHit>> LookUpInTier(std::span<const Hash128> keys);
  // Fetched chunk bytes into fresh pool blocks (checked against this model and layout).
  absl::StatusOr<std::vector<KvBlockRef>> ImportChunk(const Hash128& key, int num_tokens, int anchor_tokens,
                                                      const std::string& stored);
  void PublishChunk(const Hash128& key, std::span<const KvBlockRef> blocks, int anchor_tokens, uint64_t lease_id);
  // Attaches a chunk to the sequence at its logical position (lazy: by reference with a
  // delta; block: a re-rotated copy).
  absl::Status AttachChunk(Sequence& seq, AttentionMode mode, std::vector<KvBlockRef> chunk, int32_t delta,
                           Usage& usage);
  absl::Status AttachCachedPrefix(Sequence& seq, std::span<const int32_t> tokens, Usage& usage,
                                  std::vector<Hash128>& block_keys);
  // Appends own tokens and runs them; returns the last token's logits if asked.
  absl::StatusOr<std::vector<float>> RunOwnTokens(Sequence& seq, std::span<const int32_t> tokens, bool want_logits);

  std::unique_ptr<Backend> backend_;
  EngineOptions options_;
  Hash128 fingerprint_;
  KvDtype kv_dtype_;
  KvBlockAllocator allocator_;
  KvCacheIndex index_;
};

}  // namespace lazykv
