#include "cache_server/cache_metrics.h"

namespace lazykv::cache {
namespace {

template <typename Builder>
auto& Family(Builder builder, const std::string& name, const std::string& help, prometheus::Registry& registry) {
  return builder.Name(name).Help(help).Register(registry);
}

}  // namespace

CacheMetrics::CacheMetrics() : registry_(std::make_shared<prometheus::Registry>()) {
  auto& r = *registry_;
  auto& hits = Family(prometheus::BuildCounter(), "lazykv_cache_hits_total", "Chunk lookups found, by tier", r);
  auto& bytes_out =
      Family(prometheus::BuildCounter(), "lazykv_cache_bytes_out_total", "Chunk bytes served, by tier", r);
  auto& evictions =
      Family(prometheus::BuildCounter(), "lazykv_cache_evictions_total", "Chunks that left a tier for space", r);
  auto& corrupt = Family(prometheus::BuildCounter(), "lazykv_cache_corrupt_values_total",
                         "Stored chunks that failed their checksum and were dropped", r);
  auto& occupancy = Family(prometheus::BuildGauge(), "lazykv_cache_occupancy_bytes", "Bytes stored, by tier", r);
  auto& capacity = Family(prometheus::BuildGauge(), "lazykv_cache_capacity_bytes", "Configured bytes, by tier", r);
  auto& entries = Family(prometheus::BuildGauge(), "lazykv_cache_entries", "Chunks stored, by tier", r);
  auto tier = [&](const std::string& name) {
    const prometheus::Labels labels{{"tier", name}};
    return TierMetrics{&hits.Add(labels),      &bytes_out.Add(labels), &evictions.Add(labels), &corrupt.Add(labels),
                       &occupancy.Add(labels), &capacity.Add(labels),  &entries.Add(labels)};
  };
  host = tier("host");
  disk = tier("disk");
  gpu = tier("gpu");
  lookups = &Family(prometheus::BuildCounter(), "lazykv_cache_lookups_total", "Chunk keys looked up", r).Add({});
  misses = &Family(prometheus::BuildCounter(), "lazykv_cache_misses_total", "Chunk lookups not found", r).Add({});
  bytes_in = &Family(prometheus::BuildCounter(), "lazykv_cache_bytes_in_total", "Chunk bytes stored by Put", r).Add({});
  demotions = &Family(prometheus::BuildCounter(), "lazykv_cache_demotions_total",
                      "Chunks evicted from host RAM that stay on disk", r)
                   .Add({});
  promotions = &Family(prometheus::BuildCounter(), "lazykv_cache_promotions_total",
                       "Chunks read from disk back into host RAM", r)
                    .Add({});
  gpu_promotions = &Family(prometheus::BuildCounter(), "lazykv_cache_gpu_promotions_total",
                           "Chunks read from host RAM or disk and copied into the GPU tier", r)
                        .Add({});
  gpu_demotions = &Family(prometheus::BuildCounter(), "lazykv_cache_gpu_demotions_total",
                          "Chunks evicted from the GPU tier that no lower tier held, stored back in host RAM", r)
                       .Add({});
  lease_grants = &Family(prometheus::BuildCounter(), "lazykv_cache_lease_grants_total",
                         "Leases granted: a caller told to compute a missing chunk", r)
                      .Add({});
  lease_waits = &Family(prometheus::BuildCounter(), "lazykv_cache_lease_waits_total",
                        "Lease calls that waited for another caller's computation", r)
                     .Add({});
  lease_expiries = &Family(prometheus::BuildCounter(), "lazykv_cache_lease_expiries_total",
                           "Leases that expired before their chunk was published", r)
                        .Add({});
  pending_disk_writes = &Family(prometheus::BuildGauge(), "lazykv_cache_pending_disk_writes",
                                "Chunks written to host RAM and not yet to disk", r)
                             .Add({});
  active_streams =
      &Family(prometheus::BuildGauge(), "lazykv_cache_active_streams", "Streams and waits in progress", r).Add({});
  auto& sent_bytes = Family(prometheus::BuildCounter(), "lazykv_cache_bytes_sent_total",
                           "Chunk bytes handed to readers, by transport (grpc: streamed; shm: page locations)", r);
  auto& sent_chunks =
      Family(prometheus::BuildCounter(), "lazykv_cache_chunks_sent_total", "Chunks handed to readers, by transport", r);
  grpc_sent = {&sent_bytes.Add({{"transport", "grpc"}}), &sent_chunks.Add({{"transport", "grpc"}})};
  shm_sent = {&sent_bytes.Add({{"transport", "shm"}}), &sent_chunks.Add({{"transport", "shm"}})};
  cuda_ipc_sent = {&sent_bytes.Add({{"transport", "cuda_ipc"}}), &sent_chunks.Add({{"transport", "cuda_ipc"}})};
  nccl_sent = {&sent_bytes.Add({{"transport", "nccl"}}), &sent_chunks.Add({{"transport", "nccl"}})};
  socket_sent = {&sent_bytes.Add({{"transport", "socket"}}), &sent_chunks.Add({{"transport", "socket"}})};
  auto& received_bytes = Family(prometheus::BuildCounter(), "lazykv_cache_bytes_received_total",
                               "Chunk bytes stored from writers, by transport (grpc: Put; shm: ShmCommit)", r);
  auto& received_chunks = Family(prometheus::BuildCounter(), "lazykv_cache_chunks_received_total",
                                 "Chunks stored from writers, by transport", r);
  grpc_received = {&received_bytes.Add({{"transport", "grpc"}}), &received_chunks.Add({{"transport", "grpc"}})};
  shm_received = {&received_bytes.Add({{"transport", "shm"}}), &received_chunks.Add({{"transport", "shm"}})};
  shm_sessions =
      &Family(prometheus::BuildGauge(), "lazykv_cache_shm_sessions", "Same-host (shared memory) sessions open", r)
           .Add({});
  shm_leases = &Family(prometheus::BuildGauge(), "lazykv_cache_shm_leases",
                       "Read leases held on host pages by same-host readers", r)
                    .Add({});
  shm_leased_bytes = &Family(prometheus::BuildGauge(), "lazykv_cache_shm_leased_bytes",
                             "Host bytes held by same-host sessions: read leases and reservations for publications", r)
                          .Add({});
  shm_orphaned_sessions =
      &Family(prometheus::BuildGauge(), "lazykv_cache_shm_orphaned_sessions",
              "Same-host sessions that ended while their worker's process lives on: their pages stay held", r)
           .Add({});
  rejected_ = &Family(prometheus::BuildCounter(), "lazykv_cache_rejected_total", "Calls refused, by reason", r);
  latency_ = &Family(prometheus::BuildHistogram(), "lazykv_cache_request_seconds", "Call latency, by method", r);
  reports_ = &Family(prometheus::BuildCounter(), "lazykv_cache_invalid_reports_total",
                     "Chunks workers refused and reported, by what this server did", r);
  // Every label value exported from the start, at 0: dashboards find the series before the
  // first event, and rate() sees that first event.
  for (const char* reason : {"chunk_too_large", "host_full", "lease_held", "max_concurrent_streams", "max_lookup_keys",
                             "max_streams_per_client", "stream_idle_timeout", "unauthenticated", "permission_denied",
                             "bad_mac", "non_finite", "shm_lease_limit", "shm_session_limit"}) {
    rejected_->Add({{"reason", reason}});
  }
  for (const char* outcome : {"dropped", "stale", "verified_good"}) reports_->Add({{"outcome", outcome}});
  for (const char* method : {"lookup", "get", "put", "lease"}) ObserveLatencyFamilyOnly(method);
}

void CacheMetrics::ObserveLatencyFamilyOnly(const std::string& method) {
  latency_->Add({{"method", method}}, LatencyBuckets());
}

void CacheMetrics::CountRejected(const std::string& reason) { rejected_->Add({{"reason", reason}}).Increment(); }

void CacheMetrics::CountReport(const std::string& outcome) { reports_->Add({{"outcome", outcome}}).Increment(); }

const prometheus::Histogram::BucketBoundaries& CacheMetrics::LatencyBuckets() {
  static const prometheus::Histogram::BucketBoundaries kBuckets = {0.0001, 0.0003, 0.001, 0.003, 0.01, 0.03,
                                                                   0.1,    0.3,    1,     3,     10};
  return kBuckets;
}

void CacheMetrics::ObserveLatency(const std::string& method, double seconds) {
  latency_->Add({{"method", method}}, LatencyBuckets()).Observe(seconds);
}

}  // namespace lazykv::cache
