// The worker's Prometheus metrics (DESIGN.md section 6): TTFT and inter-token latency
// histograms, requests by outcome, tokens generated, prompt tokens by where their KV
// came from, KV pool occupancy, and the admission queue.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <memory>
#include <string>

#include "worker/engine/engine.h"
#include "worker/tier/chunk_tier.h"

namespace lazykv {

// Thread-safe: prometheus-cpp metrics are; handlers and the loop thread update it.
class WorkerMetrics {
 public:
  WorkerMetrics();
  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

  // A finished request: its latencies and where its prompt's KV came from.
  void ObserveFinished(const GenerateResult& result);
  void ObserveInterToken(double seconds) { inter_token_->Observe(seconds); }
  // outcome: "ok", or a gRPC status code name.
  void CountRequest(const std::string& outcome);
  void CountGenerated(int tokens) { generated_tokens_->Increment(tokens); }  // streamed to a client
  // An idle engine's watch for work (GenerationLoopOptions::idle_spin) ended: it took posted
  // work, or it ran out and the thread went to sleep.
  void CountIdleWatch(bool took_work) { (took_work ? idle_watch_took_ : idle_watch_ran_out_)->Increment(); }
  uint64_t IdleWatches(bool took_work) const {
    return static_cast<uint64_t>((took_work ? idle_watch_took_ : idle_watch_ran_out_)->Value());
  }
  // A document text's tokens taken from the DocumentTokenCache, or tokenized.
  void CountDocumentTokens(bool cached) { (cached ? document_text_hits_ : document_text_misses_)->Increment(); }
  void SetEngineState(const EngineStats& stats);
  // The chunk pipeline's counters so far (its decisions, publications, lease waits): the
  // metrics advance by the difference from the last snapshot. Called by one thread.
  void ObservePipeline(const ChunkPipelineStats& stats);
  // The cache tier's transport counters so far (ChunkTier::transport_stats), the same way.
  void ObserveTransports(const TransportStats& stats);

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>* requests_;
  prometheus::Histogram* ttft_;
  prometheus::Histogram* inter_token_;
  prometheus::Histogram* queue_time_;
  prometheus::Counter* generated_tokens_;
  prometheus::Counter* idle_watch_took_;
  prometheus::Counter* idle_watch_ran_out_;
  prometheus::Counter* document_text_hits_;
  prometheus::Counter* document_text_misses_;
  prometheus::Counter* prompt_tokens_pool_;
  prometheus::Counter* prompt_tokens_host_;
  prometheus::Counter* prompt_tokens_disk_;
  prometheus::Counter* prompt_tokens_remote_;
  prometheus::Counter* prompt_tokens_computed_;
  prometheus::Counter* document_tokens_;
  prometheus::Counter* document_cached_tokens_;
  prometheus::Counter* chunk_hits_;
  prometheus::Counter* chunk_misses_;
  prometheus::Counter* chunk_recomputes_;
  prometheus::Counter* kv_bytes_copied_;
  prometheus::Counter* kv_bytes_fetched_host_;
  prometheus::Counter* kv_bytes_fetched_disk_;
  prometheus::Counter* kv_bytes_fetched_remote_;
  // From the chunk pipeline's snapshots.
  ChunkPipelineStats last_pipeline_;
  prometheus::Counter* decision_fetch_;
  prometheus::Counter* decision_miss_;
  prometheus::Counter* decision_chosen_;
  prometheus::Counter* decision_failed_;
  prometheus::Counter* decision_busy_;
  prometheus::Counter* published_;
  prometheus::Counter* publish_failures_;
  prometheus::Counter* chunks_rejected_;
  prometheus::Counter* publications_dropped_;
  prometheus::Counter* lease_waits_;
  prometheus::Gauge* publish_bytes_in_flight_;
  // From the tier's transport snapshots.
  TransportStats last_transports_;
  prometheus::Counter* fetched_chunks_grpc_;
  prometheus::Counter* fetched_chunks_shm_;
  prometheus::Counter* fetched_bytes_grpc_;
  prometheus::Counter* fetched_bytes_shm_;
  prometheus::Counter* fetched_chunks_cuda_ipc_;
  prometheus::Counter* fetched_bytes_cuda_ipc_;
  prometheus::Counter* fetched_chunks_nccl_;
  prometheus::Counter* fetched_bytes_nccl_;
  prometheus::Counter* published_chunks_shm_;
  prometheus::Counter* published_bytes_shm_;
  prometheus::Counter* shm_fallbacks_;
  prometheus::Counter* lookup_leases_used_;
  prometheus::Counter* lookup_leases_unused_;
  prometheus::Gauge* shm_sessions_;
  prometheus::Gauge* blocks_used_;
  prometheus::Gauge* blocks_cached_;
  prometheus::Gauge* blocks_free_;
  prometheus::Gauge* blocks_reserved_;
  prometheus::Gauge* queued_;
  prometheus::Gauge* running_;
};

}  // namespace lazykv
