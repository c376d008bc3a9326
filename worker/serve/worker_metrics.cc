#include "worker/serve/worker_metrics.h"

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

}  // namespace

WorkerMetrics::WorkerMetrics() : registry_(std::make_shared<prometheus::Registry>()) {
  auto& r = *registry_;
  requests_ = &Family(prometheus::BuildCounter(), "lazykv_worker_requests_total", "Generate calls, by outcome", r);
  ttft_ = &Family(prometheus::BuildHistogram(), "lazykv_worker_ttft_seconds", "Arrival to the first generated token", r)
               .Add({}, kLatencyBuckets);
  inter_token_ = &Family(prometheus::BuildHistogram(), "lazykv_worker_inter_token_seconds",
                         "Time between consecutive generated tokens of a request", r)
                      .Add({}, kLatencyBuckets);
  queue_time_ = &Family(prometheus::BuildHistogram(), "lazykv_worker_queue_seconds",
                        "Arrival to admission (KV blocks reserved)", r)
                     .Add({}, kLatencyBuckets);
  generated_tokens_ = Counter("lazykv_worker_generated_tokens_total", "Tokens generated", r);
  auto& prompt = Family(prometheus::BuildCounter(), "lazykv_worker_prompt_tokens_total",
                        "Prompt tokens, by where their KV came from", r);
  prompt_tokens_pool_ = &prompt.Add({{"source", "gpu"}});
  prompt_tokens_host_ = &prompt.Add({{"source", "host"}});
  prompt_tokens_disk_ = &prompt.Add({{"source", "disk"}});
  prompt_tokens_computed_ = &prompt.Add({{"source", "computed"}});
  document_tokens_ = Counter("lazykv_worker_document_tokens_total", "Document tokens requested", r);
  document_cached_tokens_ =
      Counter("lazykv_worker_document_cached_tokens_total", "Document tokens whose KV was reused", r);
  chunk_hits_ = Counter("lazykv_worker_chunk_hits_total", "Documents and anchors reused, from any source", r);
  chunk_misses_ = Counter("lazykv_worker_chunk_misses_total", "Documents and anchors encoded", r);
  kv_bytes_copied_ =
      Counter("lazykv_worker_kv_bytes_copied_total", "KV bytes re-rotated into private copies (the block baseline)", r);
  kv_bytes_fetched_ = Counter("lazykv_worker_kv_bytes_fetched_total", "Chunk bytes fetched from the cache tier", r);
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
  generated_tokens_->Increment(static_cast<double>(result.tokens.size()));
  const Usage& u = result.usage;
  prompt_tokens_pool_->Increment(u.pool_tokens);
  prompt_tokens_host_->Increment(u.host_tokens);
  prompt_tokens_disk_->Increment(u.disk_tokens);
  prompt_tokens_computed_->Increment(u.computed_tokens);
  document_tokens_->Increment(u.document_tokens);
  document_cached_tokens_->Increment(u.document_cached_tokens);
  chunk_hits_->Increment(u.chunk_hits);
  chunk_misses_->Increment(u.chunk_misses);
  kv_bytes_copied_->Increment(static_cast<double>(u.kv_bytes_copied));
  kv_bytes_fetched_->Increment(static_cast<double>(u.kv_bytes_fetched));
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
