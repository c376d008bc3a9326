// The chunk pipeline (DESIGN.md section 4): everything between the engine and the cache
// tier, off the scheduling thread. For a chunk missing from the local pool it looks the
// key up, decides whether fetching beats recomputing (fetch_cost_model.h), fetches,
// checks and stages the bytes on the device, or takes the tier's lease so the chunk is
// computed once fleet-wide; for a computed chunk it copies the captured KV out, encodes
// and uploads it. The engine only enqueues work and polls for outcomes.
//
// Bounded: lookups, fetches and lease waits run on a fixed pool of threads with a bounded
// queue (a chunk that finds the queue full is computed, counted as "busy"); publications
// run on their own threads, bounded in bytes (a publication that finds no room is dropped
// and counted, never waited for).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "common/chunk_codec.h"
#include "common/chunk_mac.h"
#include "common/mutex.h"
#include "worker/backend/backend.h"
#include "worker/tier/bounded_executor.h"
#include "worker/tier/chunk_tier.h"
#include "worker/tier/fetch_cost_model.h"
#include "worker/tier/fifo_gate.h"
#include "worker/tier/lease_keeper.h"

namespace lazykv {

// Whether a chunk the tier holds is fetched: as the measured rates say, or always, or
// never (recomputed; for baselines and experiments).
enum class FetchPolicy { kAuto, kAlways, kNever };
absl::StatusOr<FetchPolicy> ParseFetchPolicy(std::string_view name);  // "auto", "always", "never"
const char* FetchPolicyName(FetchPolicy policy);

struct ChunkPipelineOptions {
  int tier_threads = 4;                     // fetches, lease waits
  int lookup_threads = 2;                   // lookups (never queued behind a slow fetch)
  // Fetched chunks copied to the device at once, at most, first come first served (two
  // already fill a host-to-device link: bench/results/served_2026-11-25b.md).
  int max_concurrent_stagings = 2;
  int max_queued_tasks = 256;               // beyond this a chunk is computed without asking the tier
  int publish_threads = 2;                  // copy-out, checksum, upload
  uint64_t max_publish_bytes = 1ull << 30;  // captured chunks not yet published
  // A lease's TTL: a few times the chunk's expected compute time (a forward step with its
  // tokens), within these bounds (the most before any step is measured); the holder renews
  // it while it computes (worker/tier/lease_keeper.h), for max_lease_hold at most.
  std::chrono::milliseconds min_lease_ttl{1000};
  std::chrono::milliseconds lease_ttl{10000};
  std::chrono::milliseconds max_lease_hold{120000};
  // Waiting for another holder's publication: a few times the chunk's expected compute
  // time, within these bounds; then it is computed here without the lease, so a holder
  // that squats a lease costs others a bounded wait. Before any step is measured (a cold
  // worker, whose first chunks may be the ones squatted) the wait is cold_lease_wait.
  std::chrono::milliseconds min_lease_wait{250};
  std::chrono::milliseconds max_lease_wait{30000};
  std::chrono::milliseconds cold_lease_wait{2000};
  FetchPolicy fetch_policy = FetchPolicy::kAuto;
  // The fleet's chunk MAC (common/chunk_mac.h): chunks published are signed, chunks fetched
  // are checked before staging. Null: neither (a fleet without a secret trusts its tier).
  std::shared_ptr<const ChunkMac> mac;
};

// Why a chunk is computed here.
enum class ComputeReason {
  kMiss,    // the tier does not hold it (computed under the tier's lease when granted)
  kChosen,  // the tier holds it, but recomputing was judged faster than fetching
  kFailed,  // the tier holds it, but the fetch failed or the bytes were unusable
  kBusy,    // the pipeline's queue was full: the tier was not asked
};

// What became of a requested chunk.
struct ChunkOutcome {
  Hash128 key;
  bool fetched = false;
  // fetched: the payload, staged for Backend::ImportStaged, and where it came from.
  std::unique_ptr<StagedChunk> staged;
  ChunkSource source = ChunkSource::kHost;
  uint64_t stored_bytes = 0;
  // else computed: why, and the lease to publish under (0: publish without one, or not at
  // all when `publish` is false: the tier already holds it).
  ComputeReason reason = ComputeReason::kMiss;
  uint64_t lease_id = 0;
  bool publish = true;
};

struct ChunkPipelineStats {
  uint64_t requested = 0;
  uint64_t fetched = 0;
  uint64_t fetched_bytes = 0;
  uint64_t fetch_failures = 0;
  uint64_t chunks_rejected = 0;  // of the failures: a MAC that does not match, or non-finite values
  uint64_t computed_miss = 0;
  uint64_t computed_chosen = 0;
  uint64_t computed_failed = 0;
  uint64_t computed_busy = 0;
  uint64_t lease_waits = 0;
  uint64_t published = 0;
  uint64_t published_bytes = 0;
  uint64_t publish_failures = 0;
  uint64_t publications_dropped = 0;  // no room in the publication budget, or capture failed
  uint64_t publish_bytes_in_flight = 0;
  // Where the fetched chunks' time went, summed: the tier's call, the checks (checksum when
  // the tier did not verify it, MAC, finite values), staging on the device.
  double fetch_tier_seconds = 0, fetch_check_seconds = 0, fetch_stage_seconds = 0;
};

// One line for logs: what was requested, fetched, computed (and why), published.
std::string FormatPipelineStats(const ChunkPipelineStats& stats);

// Thread-safety: Request, Poll, Publish, ReleaseLease, RecordPrefill and the accessors
// are called by the engine's scheduling thread and never block on the tier; Flush and
// WaitForOutcome block by design. Internally the work runs on the pipeline's threads;
// the tier is thread-safe and the backend's StageChunk and ExportedChunk::CopyTo are.
class ChunkPipeline {
 public:
  // `backend` outlives the pipeline. `fingerprint` and `kv_dtype` describe the chunks
  // this backend produces and accepts.
  ChunkPipeline(std::shared_ptr<ChunkTier> tier, Backend* backend, Hash128 fingerprint, KvDtype kv_dtype,
                ChunkPipelineOptions options);
  ~ChunkPipeline();  // finishes queued publications, then stops

  struct ChunkRequest {
    Hash128 key;
    int num_tokens = 0;
    int anchor_tokens = 0;  // tokens the chunk was encoded after (its layout)
  };
  // Starts resolving chunks (one batched lookup). Each gets exactly one outcome.
  void Request(std::vector<ChunkRequest> chunks);
  // Outcomes that arrived since the last call.
  std::vector<ChunkOutcome> Poll();
  // Blocks until an outcome is waiting or `timeout` passes.
  void WaitForOutcome(std::chrono::milliseconds timeout);

  // Publication, in two steps so that nothing is captured when it would be dropped:
  // TryReservePublish takes `payload_bytes` from the budget (false: dropped, counted, and
  // the lease released); Publish hands over the captured chunk; CancelPublish gives the
  // bytes back when the capture failed.
  bool TryReservePublish(const Hash128& key, uint64_t payload_bytes, uint64_t lease_id);
  void Publish(const Hash128& key, const ChunkLayout& layout, uint64_t lease_id,
               std::unique_ptr<ExportedChunk> exported);
  void CancelPublish(const Hash128& key, uint64_t payload_bytes, uint64_t lease_id);
  // Gives a lease back (a chunk nobody needs any more), asynchronously.
  void ReleaseLease(const Hash128& key, uint64_t lease_id);

  // Prefill timing from the engine's steps: a forward step of `step`'s shape took
  // `seconds` (the cost model's compute side).
  void RecordStep(const StepShape& step, double seconds);
  // Prefill tokens waiting in the engine (requests' own tokens and chunks to encode), as of
  // its latest step: a chunk computed here is ready only after them, so a fetch is judged
  // against that wait, not against the chunk's own compute alone. Chunks this pipeline
  // chooses to compute count on top until the engine's next report.
  void SetPrefillBacklog(int64_t tokens);

  // Blocks until every publication handed over so far has finished.
  void Flush();
  ChunkPipelineStats stats() const;
  FetchCostModel& cost_model() { return cost_; }
  const LeaseKeeper& lease_keeper() const { return lease_keeper_; }
  ChunkTier& tier() { return *tier_; }
  const ChunkTier& tier() const { return *tier_; }

 private:
  void RunLookup(const std::vector<ChunkRequest>& chunks) ABSL_LOCKS_EXCLUDED(mu_);
  void Resolve(const ChunkRequest& chunk, const std::optional<TierHit>& hit) ABSL_LOCKS_EXCLUDED(mu_);
  // Fetches, checks and stages a chunk; null when any step fails. `server_tier`: where the
  // lookup said a cache server holds it (its fetch is measured under that name).
  std::unique_ptr<StagedChunk> FetchAndStage(const ChunkRequest& chunk, ChunkSource* source, uint64_t* bytes,
                                             const std::string& server_tier = "") ABSL_LOCKS_EXCLUDED(mu_);
  // Computes under the tier's lease (or after waiting for another worker's publication,
  // fetches that): the path of a miss and of a failed fetch.
  void LeaseOrWait(const ChunkRequest& chunk, ComputeReason reason) ABSL_LOCKS_EXCLUDED(mu_);
  void RunPublication(const Hash128& key, const ChunkLayout& layout, uint64_t lease_id,
                      std::shared_ptr<ExportedChunk> exported) ABSL_LOCKS_EXCLUDED(mu_);
  void Deliver(ChunkOutcome outcome) ABSL_LOCKS_EXCLUDED(mu_);
  // The expected compute time of `num_tokens` scaled by `factor`, within [lo, hi];
  // `unmeasured` (clamped to them) before any step was measured.
  std::chrono::milliseconds ComputeBound(int num_tokens, double factor, std::chrono::milliseconds lo,
                                         std::chrono::milliseconds hi, std::chrono::milliseconds unmeasured) const;
  // The fetch policy's (or the cost model's) answer; `explore`: a fetch made to measure.
  bool ShouldFetch(const TierHit& hit, int num_tokens, bool* explore) ABSL_LOCKS_EXCLUDED(mu_);
  // Prefill tokens ahead of a chunk computed now (the engine's backlog and this pipeline's
  // choices since its report).
  int64_t QueuedPrefillTokens() const { return engine_backlog_.load() + chosen_since_report_.load(); }
  // How long a fetch may wait (for a probe, for staging room) before computing the chunk
  // would have been sooner: its compute behind the queued prefill, and two steps at least.
  std::chrono::microseconds FetchWaitBound(int num_tokens) const;

  const std::shared_ptr<ChunkTier> tier_;
  Backend* const backend_;
  const Hash128 fingerprint_;
  const KvDtype kv_dtype_;
  const ChunkPipelineOptions options_;
  FetchCostModel cost_;       // thread-safe itself
  FifoGate staging_gate_;    // thread-safe itself
  std::atomic<int64_t> engine_backlog_{0};
  std::atomic<int64_t> chosen_since_report_{0};
  LeaseKeeper lease_keeper_;  // thread-safe itself

  mutable Mutex mu_;
  CondVar outcome_ready_;  // outcomes_ gained an entry
  CondVar publish_idle_;   // publications_in_flight_ reached 0
  std::deque<ChunkOutcome> outcomes_ ABSL_GUARDED_BY(mu_);
  ChunkPipelineStats stats_ ABSL_GUARDED_BY(mu_);
  int publications_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;  // lease waits give up

  // Declared last: destroyed (drained and joined) first, while the members above live.
  BoundedExecutor publishers_;
  BoundedExecutor workers_;
  BoundedExecutor lookups_;  // after workers_: destroyed first, as its tasks feed workers_
};

}  // namespace lazykv
