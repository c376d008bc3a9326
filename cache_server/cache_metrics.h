// The cache server's Prometheus metrics (DESIGN.md section 6). Lookups and hits count
// once per chunk per request: the Lookup call counts; the Get and Lease calls that
// follow it do not count again.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <memory>
#include <string>

namespace lazykv::cache {

struct TierMetrics {
  prometheus::Counter* hits;
  prometheus::Counter* bytes_out;
  prometheus::Counter* evictions;
  prometheus::Counter* corrupt;
  prometheus::Gauge* occupancy;
  prometheus::Gauge* capacity;
  prometheus::Gauge* entries;
};

// Thread-safe: prometheus-cpp counters, gauges and histograms are; the pointers are set
// once at construction.
class CacheMetrics {
 public:
  CacheMetrics();
  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

  TierMetrics host, disk, gpu;
  prometheus::Counter* lookups;
  prometheus::Counter* misses;
  prometheus::Counter* bytes_in;
  prometheus::Counter* demotions;
  prometheus::Counter* promotions;
  prometheus::Counter* gpu_promotions;  // chunks copied into the GPU tier on a read
  prometheus::Counter* gpu_demotions;   // chunks the GPU tier evicted and stored back in host RAM
  prometheus::Counter* lease_grants;
  prometheus::Counter* lease_waits;
  prometheus::Counter* lease_expiries;
  prometheus::Gauge* pending_disk_writes;
  prometheus::Gauge* active_streams;
  // Chunks and their bytes handed to readers, by transport: streamed by Get ("grpc"), or
  // as page locations in the shared host arena by ShmGet ("shm").
  struct Transport {
    prometheus::Counter* bytes;
    prometheus::Counter* chunks;
  };
  // Across GPUs over a peer link (PeerGet): "nccl", or its host-memory twin "socket".
  Transport grpc_sent, shm_sent, cuda_ipc_sent, nccl_sent, socket_sent;
  // Chunks and bytes stored from writers, by transport: Put ("grpc") or ShmCommit ("shm").
  Transport grpc_received, shm_received;
  prometheus::Gauge* shm_sessions;      // same-host sessions open
  prometheus::Gauge* shm_leases;        // read leases held by them
  prometheus::Gauge* shm_leased_bytes;  // bytes those leases and the sessions' reservations hold
  prometheus::Gauge* shm_orphaned_sessions;  // ended while their worker's process lives (shm_lease_table.h)

  void CountRejected(const std::string& reason);
  // A worker reported a chunk it refused: dropped, stale (another version is stored, or it
  // is gone), or verified_good (this server checked its MAC and values and kept it).
  void CountReport(const std::string& outcome);
  void ObserveLatency(const std::string& method, double seconds);

 private:
  static const prometheus::Histogram::BucketBoundaries& LatencyBuckets();
  void ObserveLatencyFamilyOnly(const std::string& method);  // the series, at 0

  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>* rejected_;
  prometheus::Family<prometheus::Counter>* reports_;
  prometheus::Family<prometheus::Histogram>* latency_;
};

}  // namespace lazykv::cache
