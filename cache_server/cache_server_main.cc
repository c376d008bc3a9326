// lazykv-cache-server: one node of the cache tier (DESIGN.md section 4). Serves the
// KvCache gRPC service, gRPC health checking, and Prometheus metrics; drains its
// streams and flushes to disk on SIGTERM or SIGINT.
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "cache_server/kv_cache_service.h"
#include "common/byte_size.h"
#include "common/crash_point.h"
#include "common/flag_parser.h"
#include "common/malloc_tuning.h"
#include "common/server_runtime.h"

namespace lazykv::cache {
namespace {

constexpr char kUsage[] = R"(usage: lazykv-cache-server --listen HOST:PORT --data-dir DIR [options]
  --host-capacity BYTES     host RAM tier (default 1GiB; suffixes KiB MiB GiB TiB)
  --disk-capacity BYTES     disk tier under --data-dir: its directory's byte cap, a fixed-size value
                            file plus RocksDB's index (default 4GiB; 0: no disk tier)
  --disk-preallocate        reserve the value file's blocks at start (posix_fallocate), so a full
                            device cannot fail a write later (default: allocated as written)
  --disk-region-size BYTES  the disk tier's eviction unit, at most (default 32MiB; smaller when the
                            value file would have fewer than 16 regions)
  --disk-scrub-rate BYTES   bytes per second the background scrub reads back and checks
                            (default 16MiB; 0: no scrub)
  --metrics-listen HOST:PORT  Prometheus /metrics (default: off)
  --eviction-policy NAME    s3fifo (default) or lru, for host RAM
  --max-chunk-bytes BYTES   largest chunk accepted (default 256MiB)
  --max-message-bytes BYTES largest gRPC message (default 16MiB)
  --max-streams N           concurrent get/put streams and lease waits (default 64)
  --max-streams-per-client N  of those, what one client may hold (default: half of --max-streams);
                            a client is its token's name, else its certificate's name, else its host
  --max-threads N           gRPC handler threads; calls past them get RESOURCE_EXHAUSTED
                            (default: --max-streams + 64 + --peer-max-sessions)
  --page-size BYTES         host RAM page (default 256KiB)
  --lease-ttl-ms N          default lease lifetime (default 10000)
  --stream-idle-timeout-ms N  a get or put stream moving no message for this long is cancelled,
                            freeing its slot and reserved space (default 10000)
  --shutdown-grace-ms N     time given to in-flight calls on SIGTERM (default 10000)
  --chunk-mac-key-file F    the fleet's chunk secret (as the workers'): a put whose MAC does not match
                            or whose values are not finite is refused, and a chunk a worker reports
                            is dropped only if it fails those checks here (default: not checked here)
  --no-pin                  do not page-lock host RAM even with a GPU present
  --no-shm                  host RAM in private memory: no same-host transport (workers on this
                            host then fetch over gRPC too)
  --shm-max-sessions N      same-host worker sessions at once (default 64)
  --shm-max-leases N        read leases one session may hold at once (default 256)
  --shm-max-lease-bytes-per-session BYTES  bytes one session may hold leased (default: a
                            quarter of --host-capacity)
  --shm-max-lease-bytes BYTES  bytes all sessions together may hold leased (default: half of
                            --host-capacity); past a bound a worker reads that chunk over gRPC
  --shm-orphan-hold-s N     a session that ends while its worker's process lives on (a frozen
                            worker whose connection timed out) keeps its leased and reserved pages
                            until the process exits, or this long at most (default 600)
  --keepalive-ms N          ping an idle connection after N ms (at least 100) and close it when
                            the answer takes as long again (default: 30000, and 10000 for the
                            answer): how soon a dead or frozen worker's session ends
  --gpu-capacity BYTES      the GPU tier: the hottest chunks in device memory, promoted from host RAM
                            and disk when read, demoted when evicted; workers on this host fetch
                            them device to device through CUDA IPC (default 0: none)
  --gpu-device N            its GPU (default 0)
  --gpu-page-size BYTES     its page (default 2MiB)
  --gpu-emulate             host memory stands in for the GPU (tests on machines without one)
  --peer-max-sessions N     workers on other GPUs (or hosts) that fetch from the GPU tier over NCCL
                            links at once (default 32; each link takes some device memory)
A port of 0 picks a free one; the address is printed on stdout.
Security (plaintext and no tokens: loopback only):
)";

struct ServerFlags {
  std::string listen;
  std::string metrics_listen;
  ServerSecurityOptions security;
  int max_streams_per_client = 0;  // 0: half of max_concurrent_streams
  int max_threads = 0;             // 0: max_concurrent_streams + 64
  TieredStoreOptions store;
  ServiceLimits limits;
  uint64_t max_message_bytes = 16 << 20;
  GpuTierOptions gpu;
  PeerLinkLimits peer;
  int peer_max_sessions = 32;
  int lease_ttl_ms = 10000;
  int stream_idle_timeout_ms = 10000;
  int shutdown_grace_ms = 10000;
  bool no_pin = false;
  bool no_shm = false;
  ShmLeaseLimits shm;
  int shm_max_sessions = 64;
  int shm_max_leases = 256;
  std::shared_ptr<const ChunkMac> mac;
  int shm_orphan_hold_s = 600;
  int keepalive_ms = 0;  // 0: 30000 with a 10000 timeout
};

absl::Status ParseServerFlags(int argc, char** argv, ServerFlags& f) {
  f.store.disk_capacity_bytes = 4ull << 30;
  FlagParser parser(absl::StrCat(kUsage, kServerSecurityUsage));
  AddServerSecurityFlags(parser, f.security);
  parser.AddInt("--max-streams-per-client", &f.max_streams_per_client);
  parser.AddInt("--max-threads", &f.max_threads);
  parser.AddString("--listen", &f.listen);
  parser.AddString("--data-dir", &f.store.data_dir);
  parser.AddString("--metrics-listen", &f.metrics_listen);
  parser.AddByteSize("--host-capacity", &f.store.host_capacity_bytes);
  parser.AddByteSize("--disk-capacity", &f.store.disk_capacity_bytes);
  parser.AddByteSize("--disk-region-size", &f.store.disk_region_bytes);
  parser.AddByteSize("--disk-scrub-rate", &f.store.disk_scrub_bytes_per_second);
  parser.AddSwitch("--disk-preallocate", &f.store.disk_preallocate);
  parser.AddString("--eviction-policy", &f.store.eviction_policy);
  parser.AddByteSize("--max-chunk-bytes", &f.store.max_chunk_bytes);
  parser.AddByteSize("--max-message-bytes", &f.max_message_bytes);
  parser.AddInt("--max-streams", &f.limits.max_concurrent_streams);
  parser.AddByteSize("--page-size", &f.store.page_bytes);
  parser.AddInt("--lease-ttl-ms", &f.lease_ttl_ms);
  parser.AddInt("--stream-idle-timeout-ms", &f.stream_idle_timeout_ms);
  parser.AddInt("--shutdown-grace-ms", &f.shutdown_grace_ms);
  parser.AddSwitch("--no-pin", &f.no_pin);
  parser.AddSwitch("--no-shm", &f.no_shm);
  parser.AddInt("--shm-max-sessions", &f.shm_max_sessions);
  parser.AddInt("--shm-max-leases", &f.shm_max_leases);
  f.shm.max_bytes_per_session = 0;
  f.shm.max_bytes_total = 0;
  parser.AddByteSize("--shm-max-lease-bytes-per-session", &f.shm.max_bytes_per_session);
  parser.AddByteSize("--shm-max-lease-bytes", &f.shm.max_bytes_total);
  parser.Add("--chunk-mac-key-file", [&f](const std::string& v) -> absl::Status {
    absl::StatusOr<std::shared_ptr<const ChunkMac>> mac = ChunkMac::FromKeyFile(v);
    if (!mac.ok()) return mac.status();
    f.mac = *std::move(mac);
    return absl::OkStatus();
  });
  parser.AddInt("--shm-orphan-hold-s", &f.shm_orphan_hold_s);
  parser.AddInt("--keepalive-ms", &f.keepalive_ms);
  parser.AddByteSize("--gpu-capacity", &f.gpu.capacity_bytes);
  parser.AddInt("--gpu-device", &f.gpu.device);
  parser.AddByteSize("--gpu-page-size", &f.gpu.page_bytes);
  parser.AddSwitch("--gpu-emulate", &f.gpu.emulate);
  parser.AddInt("--peer-max-sessions", &f.peer_max_sessions);
  if (absl::Status s = parser.Parse(argc, argv); !s.ok()) return s;
  if (f.listen.empty()) return absl::InvalidArgumentError(absl::StrCat("--listen is required\n", kUsage));
  if (f.store.disk_capacity_bytes > 0 && f.store.data_dir.empty()) {
    return absl::InvalidArgumentError("--data-dir is required with a disk tier (--disk-capacity > 0)");
  }
  if (f.gpu.capacity_bytes > 0 && (f.gpu.page_bytes == 0 || f.gpu.capacity_bytes < f.gpu.page_bytes)) {
    return absl::InvalidArgumentError("--gpu-capacity must hold at least one --gpu-page-size page");
  }
  if (f.gpu.device < 0) return absl::InvalidArgumentError("--gpu-device must be >= 0");
  if (f.peer_max_sessions < 0) return absl::InvalidArgumentError("--peer-max-sessions must be >= 0");
  f.peer.max_sessions = static_cast<uint32_t>(f.peer_max_sessions);
  if (f.limits.max_concurrent_streams <= 0) return absl::InvalidArgumentError("--max-streams must be positive");
  if (f.max_streams_per_client < 0) {
    return absl::InvalidArgumentError("--max-streams-per-client must be positive (0: half of --max-streams)");
  }
  f.limits.max_streams_per_client =
      f.max_streams_per_client > 0 ? f.max_streams_per_client : std::max(1, (f.limits.max_concurrent_streams + 1) / 2);
  if (f.max_threads < 0) return absl::InvalidArgumentError("--max-threads must be positive (0: --max-streams + 64 + --peer-max-sessions)");
  // A lease wait and each stream hold a handler thread; the rest answer small calls.
  // Peer link sessions hold a handler thread each for their whole life.
  if (f.max_threads == 0) {
    f.max_threads = f.limits.max_concurrent_streams + 64 + static_cast<int>(f.peer.max_sessions);
  }
  if (absl::Status s = CheckServerSecurity(f.listen, f.security); !s.ok()) return s;
  if (f.max_message_bytes < f.limits.slice_bytes + (64 << 10)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--max-message-bytes must be at least %d (a %d-byte slice plus framing)",
                        f.limits.slice_bytes + (64 << 10), f.limits.slice_bytes));
  }
  if (f.lease_ttl_ms <= 0) return absl::InvalidArgumentError("--lease-ttl-ms must be positive");
  if (f.stream_idle_timeout_ms <= 0) return absl::InvalidArgumentError("--stream-idle-timeout-ms must be positive");
  f.limits.stream_idle_timeout = std::chrono::milliseconds(f.stream_idle_timeout_ms);
  f.limits.default_lease_ttl = std::chrono::milliseconds(f.lease_ttl_ms);
  f.store.pin_host_memory = !f.no_pin;
  f.store.shared_host_memory = !f.no_shm;
  if (f.shm_max_sessions <= 0 || f.shm_max_leases <= 0) {
    return absl::InvalidArgumentError("--shm-max-sessions and --shm-max-leases must be positive");
  }
  f.shm.max_sessions = static_cast<uint32_t>(f.shm_max_sessions);
  f.shm.max_leases_per_session = static_cast<uint32_t>(f.shm_max_leases);
  if (f.shm.max_bytes_per_session == 0) f.shm.max_bytes_per_session = f.store.host_capacity_bytes / 4;
  if (f.shm.max_bytes_total == 0) f.shm.max_bytes_total = f.store.host_capacity_bytes / 2;
  if (f.shm_orphan_hold_s < 0) return absl::InvalidArgumentError("--shm-orphan-hold-s must be >= 0");
  f.shm.orphan_hold = std::chrono::seconds(f.shm_orphan_hold_s);
  if (f.keepalive_ms != 0 && f.keepalive_ms < 100) {
    return absl::InvalidArgumentError("--keepalive-ms must be at least 100");
  }
  return absl::OkStatus();
}

int Serve(int argc, char** argv) {
  ServerFlags flags;
  if (absl::Status s = ParseServerFlags(argc, argv, flags); !s.ok()) return ExitForFlagError(s, "lazykv-cache-server");
  BlockTerminationSignals();

  auto metrics = std::make_shared<CacheMetrics>();
  auto store = TieredStore::Open(flags.store, metrics);
  if (!store.ok()) {
    spdlog::error("cannot open the store: {}", std::string(store.status().message()));
    return 1;
  }
  TieredStore* store_ptr = store->get();
  LeaseTable leases([store_ptr](const Hash128& key) { return store_ptr->Locate(key).has_value(); }, metrics.get());
  auto authorizer =
      CallAuthorizer::Create(flags.security.auth_tokens_file, std::chrono::seconds(flags.security.reload_interval_s));
  if (!authorizer.ok()) {
    spdlog::error("{}", std::string(authorizer.status().message()));
    return 1;
  }
  KvCacheService service(store_ptr, &leases, flags.limits, authorizer->get(), flags.mac);
  ShmLeaseTable shm_leases(flags.shm, metrics.get());
  if ((*store)->arena().shared()) service.EnableShm(&shm_leases);
  std::unique_ptr<GpuTier> gpu;  // before the store goes: its promoter demotes into it
  if (flags.gpu.capacity_bytes > 0) {
    flags.gpu.eviction_policy = flags.store.eviction_policy;
    auto created = GpuTier::Create(
        flags.gpu, metrics, [store_ptr](const Hash128& key) { return store_ptr->Locate(key).has_value(); },
        [store_ptr](const Hash128& key, std::string bytes) {
          if (auto put = store_ptr->Put(key, bytes); !put.ok()) {
            spdlog::warn("GPU tier: demoting {} failed: {}", key.ToHex(), put.status().ToString());
          }
        });
    if (!created.ok()) {
      spdlog::error("{}", created.status().ToString());
      return 1;
    }
    gpu = *std::move(created);
    service.EnableGpuTier(gpu.get());
    spdlog::info("GPU tier: {} on {} in pages of {}", FormatByteSize(gpu->arena().capacity_bytes()),
                 gpu->arena().on_gpu() ? absl::StrFormat("GPU %d", gpu->arena().device()) : "host memory (emulated)",
                 FormatByteSize(gpu->arena().page_bytes()));
  }
  std::unique_ptr<PeerLinkTable> peers;  // after the GPU tier, so it goes first: transfers hold its pages
  if (gpu != nullptr && flags.peer.max_sessions > 0) {
    peers = std::make_unique<PeerLinkTable>(flags.peer, gpu->arena().device(), !gpu->arena().on_gpu());
    service.EnablePeerLinks(peers.get());
    const absl::Status can = peers->CanServe(peers->kind());
    spdlog::info("peer links to other GPUs: {}", can.ok() ? absl::StrFormat("%s, at most %d sessions", peers->kind(),
                                                                            flags.peer.max_sessions)
                                                          : absl::StrCat("off (", std::string(can.message()), ")"));
  }

  auto metrics_server =
      MetricsServer::Start(flags.metrics_listen, metrics->registry(), flags.security, authorizer->get());
  if (!metrics_server.ok()) {
    spdlog::error("{}", std::string(metrics_server.status().message()));
    return 1;
  }

  int port = 0;
  // Chunks are MiB-sized: a large flow-control window keeps a stream from stalling.
  auto started = StartGrpcServer(GrpcServerOptions{.listen = flags.listen,
                                                   .service_name = v1::KvCache::service_full_name(),
                                                   .credentials = MakeServerCredentials(flags.security),
                                                   .max_message_bytes = flags.max_message_bytes,
                                                   .stream_window_bytes = 8 << 20,
                                                   .max_threads = flags.max_threads,
                                                   .keepalive_time_ms = flags.keepalive_ms > 0 ? flags.keepalive_ms : 30000,
                                                   .keepalive_timeout_ms = flags.keepalive_ms > 0 ? flags.keepalive_ms : 10000},
                                 &service, &port);
  if (!started.ok()) {
    spdlog::error("{}", std::string(started.status().message()));
    return 1;
  }
  std::unique_ptr<grpc::Server> server = *std::move(started);
  const TieredStoreStats stats = (*store)->stats();
  spdlog::info("host tier {} ({}), disk tier {} ({} chunks on disk), policy {}", FormatByteSize(stats.host_capacity),
               stats.host_pinned ? "pinned" : "pageable", FormatByteSize(stats.disk_capacity), stats.disk_entries,
               flags.store.eviction_policy);
  spdlog::info("chunk MAC checks {}", flags.mac != nullptr ? "on" : "off (workers check)");
  if ((*store)->arena().shared()) {
    spdlog::info("same-host transport on: host RAM is shared memory; at most {} sessions, {} leases and {} per session, "
                 "{} leased in all",
                 flags.shm.max_sessions, flags.shm.max_leases_per_session,
                 FormatByteSize(flags.shm.max_bytes_per_session), FormatByteSize(flags.shm.max_bytes_total));
  } else {
    spdlog::info("same-host transport off{}", flags.no_shm ? " (--no-shm)" : " (no shared memory)");
  }
  if (const auto armed = crash_point::ArmedNames(); !armed.empty()) {
    spdlog::warn("crash points armed (testing only): {} with probability {}", absl::StrJoin(armed, ","),
                 crash_point::Probability());
  }
  spdlog::info("transport {}, tokens {}",
               flags.security.tls_cert_file.empty()        ? "plaintext"
               : flags.security.tls_client_ca_file.empty() ? "TLS"
                                                           : "mutual TLS",
               (*authorizer)->enabled() ? flags.security.auth_tokens_file : "off (every call allowed)");
  PrintListening("lazykv-cache-server", flags.listen, port, metrics_server->get(), flags.metrics_listen);

  const int signal_number = WaitForTerminationSignal();
  spdlog::info("signal {}: draining streams and flushing", signal_number);
  server->GetHealthCheckService()->Shutdown();  // NOT_SERVING, and its own calls end
  leases.Shutdown();                            // lease waiters answer now instead of holding up the drain
  shm_leases.Shutdown();                        // same-host sessions end (they last as long as their workers)
  if (peers != nullptr) peers->Shutdown();      // and peer link sessions
  // Idle client connections hold this up for a few seconds (gRPC's GOAWAY exchange),
  // never past the grace period.
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(flags.shutdown_grace_ms));
  spdlog::info("calls drained; flushing the disk tier");
  peers.reset();           // links aborted: their transfers let go of the GPU tier's pages
  gpu.reset();             // its promoter stops before the store it demotes into goes
  shm_leases.DropAll();    // leases and reservations hold host pages of the store's arena
  if (absl::Status s = (*store)->Flush(); !s.ok()) {
    spdlog::error("flush failed: {}", std::string(s.message()));
    return 1;
  }
  store->reset();
  spdlog::info("stopped cleanly");
  return 0;
}

}  // namespace
}  // namespace lazykv::cache

int main(int argc, char** argv) {
  spdlog::set_default_logger(spdlog::stderr_color_mt("cache-server"));
  lazykv::TuneMallocForLargeBuffers();
  return lazykv::cache::Serve(argc, argv);
}
