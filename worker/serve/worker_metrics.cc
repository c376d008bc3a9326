#include "worker/serve/worker_metrics.h"

#include <tuple>

namespace lazykv {
namespace {

template <typename Builder>
auto& Family(Builder builder, const std::string& name, const std::string& help, prometheus::Registry& registry) {
  return builder.Name(name).Help(help).Register(registry);
}

prometheus::Counter* Counter(const std::string& name, const std::string& help, prometheus::Registry& r,
                             const prometheus::Labels& labels = {}) {
  return &Family(prometheus::BuildCounter(), name, help, r).Add(labels);
}

prometheus::Gauge* Gauge(const std::string& name, const std::string& help, prometheus::Registry& r,
                         const prometheus::Labels& labels = {}) {
  return &Family(prometheus::BuildGauge(), name, help, r).Add(labels);
}

// Seconds, from a fast local decode step to a long queue.
const prometheus::Histogram::BucketBoundaries kLatencyBuckets = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                                 0.25,  0.5,    1,     2.5,  5,     10,   30};

// A counter fed from snapshots of a running total: advances by what the total grew since.
void AddSince(prometheus::Counter* counter, uint64_t now, uint64_t before) {
  if (now > before) counter->Increment(static_cast<double>(now - before));
}

}  // namespace

WorkerMetrics::WorkerMetrics() : registry_(std::make_shared<prometheus::Registry>()) {
  auto& r = *registry_;
  requests_ = &Family(prometheus::BuildCounter(), "lazykv_worker_requests_total", "Generate calls, by outcome", r);
  // The outcomes a call can have, exported at 0 from the start (dashboards find them, and
  // rate() sees their first event).
  for (const char* outcome : {"OK", "INVALID_ARGUMENT", "RESOURCE_EXHAUSTED", "CANCELLED", "DEADLINE_EXCEEDED",
                              "UNAUTHENTICATED", "PERMISSION_DENIED", "UNAVAILABLE", "INTERNAL"}) {
    requests_->Add({{"outcome", outcome}});
  }
  ttft_ = &Family(prometheus::BuildHistogram(), "lazykv_worker_ttft_seconds", "Arrival to the first generated token", r)
               .Add({}, kLatencyBuckets);
  inter_token_ = &Family(prometheus::BuildHistogram(), "lazykv_worker_inter_token_seconds",
                         "Time between consecutive generated tokens of a request", r)
                      .Add({}, kLatencyBuckets);
  queue_time_ = &Family(prometheus::BuildHistogram(), "lazykv_worker_queue_seconds",
                        "Arrival to admission (KV blocks reserved)", r)
                     .Add({}, kLatencyBuckets);
  generated_tokens_ = Counter("lazykv_worker_generated_tokens_total", "Tokens generated and streamed to clients", r);
  auto& watches = Family(prometheus::BuildCounter(), "lazykv_worker_engine_idle_watches_total",
                         "Idle engine's watches for work (--idle-spin-us), by how they ended", r);
  idle_watch_took_ = &watches.Add({{"outcome", "took_work"}});
  idle_watch_ran_out_ = &watches.Add({{"outcome", "ran_out"}});
  auto& texts = Family(prometheus::BuildCounter(), "lazykv_worker_document_texts_total",
                       "Document texts of calls, by whether their tokens came from the cache", r);
  document_text_hits_ = &texts.Add({{"tokens", "cached"}});
  document_text_misses_ = &texts.Add({{"tokens", "tokenized"}});
  auto& prompt = Family(prometheus::BuildCounter(), "lazykv_worker_prompt_tokens_total",
                        "Prompt tokens, by where their KV came from", r);
  prompt_tokens_pool_ = &prompt.Add({{"source", "gpu"}});
  prompt_tokens_host_ = &prompt.Add({{"source", "host"}});
  prompt_tokens_disk_ = &prompt.Add({{"source", "disk"}});
  prompt_tokens_remote_ = &prompt.Add({{"source", "remote"}});
  prompt_tokens_computed_ = &prompt.Add({{"source", "computed"}});
  document_tokens_ = Counter("lazykv_worker_document_tokens_total", "Document tokens requested", r);
  document_cached_tokens_ =
      Counter("lazykv_worker_document_cached_tokens_total", "Document tokens whose KV was reused", r);
  chunk_hits_ = Counter("lazykv_worker_chunk_hits_total", "Documents and anchors reused, from any source", r);
  chunk_misses_ = Counter("lazykv_worker_chunk_misses_total", "Documents and anchors encoded, held nowhere", r);
  chunk_recomputes_ = Counter("lazykv_worker_chunk_recomputes_total",
                              "Documents and anchors the cache tier held but this worker encoded (recomputing "
                              "judged faster than fetching, or the fetch failed)",
                              r);
  kv_bytes_copied_ =
      Counter("lazykv_worker_kv_bytes_copied_total", "KV bytes re-rotated into private copies (the block baseline)", r);
  auto& fetched = Family(prometheus::BuildCounter(), "lazykv_worker_kv_bytes_fetched_total",
                         "Chunk bytes fetched from the cache tier, by source", r);
  kv_bytes_fetched_host_ = &fetched.Add({{"source", "host"}});
  kv_bytes_fetched_disk_ = &fetched.Add({{"source", "disk"}});
  kv_bytes_fetched_remote_ = &fetched.Add({{"source", "remote"}});
  auto& decisions = Family(prometheus::BuildCounter(), "lazykv_worker_chunk_decisions_total",
                           "What the chunk pipeline did with a chunk missing from the pool", r);
  decision_fetch_ = &decisions.Add({{"decision", "fetch"}});
  decision_miss_ = &decisions.Add({{"decision", "miss"}});
  decision_chosen_ = &decisions.Add({{"decision", "recompute_chosen"}});
  decision_failed_ = &decisions.Add({{"decision", "recompute_failed"}});
  decision_busy_ = &decisions.Add({{"decision", "busy"}});
  published_ = Counter("lazykv_worker_chunks_published_total", "Computed chunks published to the cache tier", r);
  chunks_rejected_ = Counter("lazykv_worker_chunks_rejected_total",
                             "Fetched chunks refused before use: a MAC that does not match, or non-finite values", r);
  publish_failures_ =
      Counter("lazykv_worker_chunk_publish_failures_total", "Publications the cache tier refused or lost", r);
  publications_dropped_ = Counter("lazykv_worker_publications_dropped_total",
                                  "Publications dropped because the publication budget was full (never waited for)", r);
  for (const auto& [transport, chunks, bytes] :
       {std::tuple{"grpc", &fetched_chunks_grpc_, &fetched_bytes_grpc_},
        std::tuple{"shm", &fetched_chunks_shm_, &fetched_bytes_shm_},
        std::tuple{"cuda_ipc", &fetched_chunks_cuda_ipc_, &fetched_bytes_cuda_ipc_},
        std::tuple{"nccl", &fetched_chunks_nccl_, &fetched_bytes_nccl_}}) {
    *chunks = Counter("lazykv_worker_tier_fetched_chunks_total",
                      "Chunks fetched from cache servers, by transport (shm: a server on this host, in place; "
                      "cuda_ipc: its GPU tier, device to device; nccl: a GPU tier over a link across GPUs)",
                      r, {{"transport", transport}});
    *bytes = Counter("lazykv_worker_tier_fetched_bytes_total",
                     "Stored chunk bytes fetched from cache servers, by transport", r, {{"transport", transport}});
  }
  published_chunks_shm_ =
      Counter("lazykv_worker_tier_published_chunks_total",
              "Chunks published to a cache server written in place in its shared memory", r, {{"transport", "shm"}});
  published_bytes_shm_ =
      Counter("lazykv_worker_tier_published_bytes_total",
              "Stored chunk bytes published in place in a cache server's shared memory", r, {{"transport", "shm"}});
  shm_fallbacks_ = Counter("lazykv_worker_tier_shm_fallbacks_total",
                           "Fetches tried over shared memory and served over gRPC instead (a lease bound, no room)", r);
  lookup_leases_used_ =
      Counter("lazykv_worker_tier_lookup_leases_total", "Same-host leases a lookup took ahead of the fetch, by outcome",
              r, {{"outcome", "used"}});
  lookup_leases_unused_ =
      Counter("lazykv_worker_tier_lookup_leases_total", "Same-host leases a lookup took ahead of the fetch, by outcome",
              r, {{"outcome", "unused"}});
  shm_sessions_ = Gauge("lazykv_worker_tier_shm_sessions", "Same-host sessions with cache servers open now", r);
  lease_waits_ = Counter("lazykv_worker_lease_waits_total", "Chunks waited for while another worker computed them", r);
  publish_bytes_in_flight_ =
      Gauge("lazykv_worker_publish_bytes_in_flight", "Captured chunk bytes not yet published (the budget's use)", r);
  auto& blocks = Family(prometheus::BuildGauge(), "lazykv_worker_kv_blocks", "KV pool blocks, by state", r);
  blocks_used_ = &blocks.Add({{"state", "used"}});
  blocks_cached_ = &blocks.Add({{"state", "cached"}});
  blocks_free_ = &blocks.Add({{"state", "free"}});
  blocks_reserved_ = Gauge("lazykv_worker_kv_blocks_reserved", "Worst-case blocks reserved by running requests", r);
  queued_ = Gauge("lazykv_worker_queued_requests", "Requests waiting for KV pool room", r);
  running_ = Gauge("lazykv_worker_running_requests", "Requests admitted and not finished", r);
}

void WorkerMetrics::ObserveFinished(const GenerateResult& result) {
  ttft_->Observe(result.ttft_seconds);
  queue_time_->Observe(result.queue_seconds);
  const Usage& u = result.usage;
  prompt_tokens_pool_->Increment(u.pool_tokens);
  prompt_tokens_host_->Increment(u.host_tokens);
  prompt_tokens_disk_->Increment(u.disk_tokens);
  prompt_tokens_remote_->Increment(u.remote_tokens);
  prompt_tokens_computed_->Increment(u.computed_tokens);
  document_tokens_->Increment(u.document_tokens);
  document_cached_tokens_->Increment(u.document_cached_tokens);
  chunk_hits_->Increment(u.chunk_hits);
  chunk_misses_->Increment(u.chunk_misses);
  chunk_recomputes_->Increment(u.chunk_recomputes);
  kv_bytes_copied_->Increment(static_cast<double>(u.kv_bytes_copied));
  kv_bytes_fetched_host_->Increment(static_cast<double>(u.host_bytes_fetched));
  kv_bytes_fetched_disk_->Increment(static_cast<double>(u.disk_bytes_fetched));
  kv_bytes_fetched_remote_->Increment(static_cast<double>(u.remote_bytes_fetched));
}

void WorkerMetrics::ObservePipeline(const ChunkPipelineStats& s) {
  const ChunkPipelineStats& last = last_pipeline_;
  AddSince(decision_fetch_, s.fetched, last.fetched);
  AddSince(decision_miss_, s.computed_miss, last.computed_miss);
  AddSince(decision_chosen_, s.computed_chosen, last.computed_chosen);
  AddSince(decision_failed_, s.computed_failed, last.computed_failed);
  AddSince(decision_busy_, s.computed_busy, last.computed_busy);
  AddSince(published_, s.published, last.published);
  AddSince(chunks_rejected_, s.chunks_rejected, last.chunks_rejected);
  AddSince(publish_failures_, s.publish_failures, last.publish_failures);
  AddSince(publications_dropped_, s.publications_dropped, last.publications_dropped);
  AddSince(lease_waits_, s.lease_waits, last.lease_waits);
  publish_bytes_in_flight_->Set(static_cast<double>(s.publish_bytes_in_flight));
  last_pipeline_ = s;
}

void WorkerMetrics::ObserveTransports(const TransportStats& s) {
  const TransportStats& last = last_transports_;
  AddSince(fetched_chunks_grpc_, s.grpc_chunks, last.grpc_chunks);
  AddSince(fetched_bytes_grpc_, s.grpc_bytes, last.grpc_bytes);
  AddSince(fetched_chunks_shm_, s.shm_chunks, last.shm_chunks);
  AddSince(fetched_bytes_shm_, s.shm_bytes, last.shm_bytes);
  AddSince(fetched_chunks_cuda_ipc_, s.cuda_ipc_chunks, last.cuda_ipc_chunks);
  AddSince(fetched_bytes_cuda_ipc_, s.cuda_ipc_bytes, last.cuda_ipc_bytes);
  AddSince(fetched_chunks_nccl_, s.nccl_chunks, last.nccl_chunks);
  AddSince(fetched_bytes_nccl_, s.nccl_bytes, last.nccl_bytes);
  AddSince(published_chunks_shm_, s.shm_published_chunks, last.shm_published_chunks);
  AddSince(published_bytes_shm_, s.shm_published_bytes, last.shm_published_bytes);
  AddSince(shm_fallbacks_, s.shm_fallbacks, last.shm_fallbacks);
  AddSince(lookup_leases_used_, s.lookup_leases_used, last.lookup_leases_used);
  AddSince(lookup_leases_unused_, s.lookup_leases_unused, last.lookup_leases_unused);
  shm_sessions_->Set(static_cast<double>(s.shm_sessions));
  last_transports_ = s;
}

void WorkerMetrics::CountRequest(const std::string& outcome) { requests_->Add({{"outcome", outcome}}).Increment(); }

void WorkerMetrics::SetEngineState(const EngineStats& s) {
  const int cached = static_cast<int>(s.cached_blocks);
  blocks_free_->Set(s.free_blocks);
  blocks_cached_->Set(cached);
  blocks_used_->Set(s.num_blocks - s.free_blocks);
  blocks_reserved_->Set(s.reserved_blocks);
  queued_->Set(s.queued_requests);
  running_->Set(s.running_requests);
}

}  // namespace lazykv
