// The GPU tier's same-host fetch (issue 17): 64 MiB chunks from a real lazykv-cache-server
// with a GPU tier on this machine's GPU, fetched by a worker's RemoteChunkTier device to
// device through the tier's CUDA IPC handle and copied into device memory as the backend's
// staging copies them (a copy per piece on a stream of its own, the value check), against a
// plain device-to-device cudaMemcpy of the same bytes in the same run; and beside it the
// same chunks from the server's host RAM over shared memory, against a pinned host-to-device
// copy. Every chunk of the first round is read back and compared byte for byte with what was
// stored; the run fails (exit 1) on any mismatch or error.
//
// With --nccl-device N (a second GPU, issue 18), the same chunks also cross to GPU N over the
// server's NCCL link (--transport nccl: PeerGet, then the payload straight into a staging
// buffer on GPU N), against a cudaMemcpyPeer of the same bytes from GPU 0 to GPU N, and are
// read back from GPU N and compared too.
//
//   gpu_tier_fetch_bench [--server PATH] [--chunks N] [--chunk-bytes BYTES] [--rounds N] [--nccl-device N]
//       [--copy-engines]
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <span>
#include <thread>

#include "bench/device_sink.h"
#include "bench/random_chunk_payload.h"
#include "cache_server/pinned_memory.h"
#include "common/byte_size.h"
#include "common/child_process.h"
#include "common/chunk_codec.h"
#include "common/flag_parser.h"
#include "common/malloc_tuning.h"
#include "common/splitmix64.h"
#include "worker/tier/remote_chunk_tier.h"

namespace lazykv {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) { return std::chrono::duration<double>(Clock::now() - since).count(); }

struct Pass {
  double seconds = 0;
  double copy_seconds = 0;  // of which the copy into the sink (the rest: the fetch call)
  int errors = 0;
  int on_device = 0;  // fetches whose payload stayed on the GPU
};

// The chunks from the GPU tier (on GPU 0) to GPU `device` over an NCCL link, whole fetches
// (PeerGet and the payload into staging on that GPU), the first round read back and compared,
// against cudaMemcpyPeer of the payload's size in the same run. Returns the errors.
int NcclPass(const std::string& address, std::span<const std::string> chunks, int rounds, int device) {
  RemoteTierOptions options;
  options.servers = {address};
  options.holder = "gpu_tier_fetch_bench-nccl";
  options.initial_call_deadline = std::chrono::seconds(2);
  options.transport = FetchTransport::kNccl;
  options.gpu_device = device;
  auto tier = *RemoteChunkTier::Create(options);
  const auto until = Clock::now() + std::chrono::seconds(60);
  while (tier->transport_stats().peer_sessions < static_cast<uint64_t>(options.peer_links_per_server) &&
         Clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (tier->transport_stats().peer_sessions == 0) {
    std::fprintf(stderr, "nccl: the link to GPU %d did not come up\n", device);
    return 1;
  }
  int errors = 0;
  const size_t payload = chunks[0].size() - kChunkHeaderBytes;
  std::string back(payload, '\0');
  double fetch_s = 0;
  for (int r = 0; r <= rounds; ++r) {  // round 0: checked, not timed
    for (const std::string& chunk : chunks) {
      const auto start = Clock::now();
      auto fetched = tier->Fetch(DecodeChunkHeader(chunk)->key);
      const double took = Seconds(start);
      if (!fetched.ok() || fetched->stored.size() != chunk.size() || !fetched->stored.on_device()) {
        std::fprintf(stderr, "nccl fetch: %s\n",
                     fetched.ok() ? "wrong size or not on the GPU" : fetched.status().ToString().c_str());
        ++errors;
        continue;
      }
      if (r == 0) {
        const std::string_view device_payload = fetched->stored.Slice(kChunkHeaderBytes, chunk.size()).pieces().at(0);
        cudaMemcpy(back.data(), device_payload.data(), payload, cudaMemcpyDefault);
        if (std::memcmp(back.data(), chunk.data() + kChunkHeaderBytes, payload) != 0) {
          std::fprintf(stderr, "nccl: chunk bytes differ from what was stored\n");
          ++errors;
        }
      } else {
        fetch_s += took;
      }
    }
  }
  // The ceiling: the same bytes GPU 0 -> GPU `device` by the copy engines, peer to peer.
  void *from = nullptr, *to = nullptr;
  cudaSetDevice(0);
  cudaMalloc(&from, payload);
  (void)cudaDeviceEnablePeerAccess(device, 0);
  cudaSetDevice(device);
  cudaMalloc(&to, payload);
  (void)cudaDeviceEnablePeerAccess(0, 0);
  cudaGetLastError();
  double peer_s = 0;
  cudaStream_t stream = nullptr;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);  // on GPU `device`: it pulls
  for (int r = 0; r <= rounds; ++r) {
    for (size_t c = 0; c < chunks.size(); ++c) {
      const auto start = Clock::now();
      // A device-to-device copy returns before it ends: wait for it.
      errors += cudaMemcpyPeerAsync(to, device, from, 0, payload, stream) == cudaSuccess ? 0 : 1;
      errors += cudaStreamSynchronize(stream) == cudaSuccess ? 0 : 1;
      if (r > 0) peer_s += Seconds(start);
    }
  }
  cudaStreamDestroy(stream);
  cudaFree(to);
  cudaSetDevice(0);
  cudaFree(from);
  const double bytes = static_cast<double>(payload) * chunks.size() * rounds;
  const TransportStats s = tier->transport_stats();
  std::printf("%-22s %10.2f %9.0f%%   (GPU 0 -> GPU %d; %.0f us a chunk)\n", "nccl fetch", bytes / fetch_s / 1e9,
              100 * peer_s / fetch_s, device, 1e6 * fetch_s / (chunks.size() * rounds));
  std::printf("%-22s %10.2f %10s\n", "cudaMemcpyPeer", bytes / peer_s / 1e9, "100%");
  std::printf("nccl fetches %llu, cuda_ipc %llu; byte-exact check of the first round: %s\n",
              static_cast<unsigned long long>(s.nccl_chunks), static_cast<unsigned long long>(s.cuda_ipc_chunks),
              errors == 0 ? "ok" : "FAILED");
  return errors + (s.cuda_ipc_chunks != 0 ? 1 : 0);
}

// Fetches every chunk through `tier` into `sink`; with `check`, reads each back and compares.
Pass FetchAll(RemoteChunkTier& tier, std::span<const std::string> chunks, bench::DeviceSink& sink, bool check) {
  Pass p;
  std::string back;
  for (const std::string& chunk : chunks) {
    const auto start = Clock::now();
    auto fetched = tier.Fetch(DecodeChunkHeader(chunk)->key);
    if (!fetched.ok() || fetched->stored.size() != chunk.size()) {
      std::fprintf(stderr, "fetch: %s\n", fetched.ok() ? "wrong size" : fetched.status().ToString().c_str());
      ++p.errors;
      continue;
    }
    const ChunkBytes payload = fetched->stored.Slice(kChunkHeaderBytes, fetched->stored.size());
    const auto copy_start = Clock::now();
    if (absl::Status s = sink.Consume(payload.pieces()); !s.ok()) {
      std::fprintf(stderr, "device copy: %s\n", s.ToString().c_str());
      ++p.errors;
      continue;
    }
    p.seconds += Seconds(start);
    p.copy_seconds += Seconds(copy_start);
    p.on_device += payload.on_device() ? 1 : 0;
    if (!check) continue;
    std::string header(kChunkHeaderBytes, '\0');
    fetched->stored.CopyTo(0, kChunkHeaderBytes, header.data());
    back.resize(payload.size());
    if (!sink.ReadBack(back.size(), back.data()).ok() || header != chunk.substr(0, kChunkHeaderBytes) ||
        std::memcmp(back.data(), chunk.data() + kChunkHeaderBytes, back.size()) != 0) {
      std::fprintf(stderr, "chunk %s: bytes differ from what was stored\n",
                   DecodeChunkHeader(chunk)->key.ToHex().c_str());
      ++p.errors;
    }
  }
  return p;
}

int Main(int argc, char** argv) {
  std::error_code ec;
  std::string server_binary =
      (std::filesystem::read_symlink("/proc/self/exe", ec).parent_path() / "lazykv-cache-server").string();
  int num_chunks = 6, rounds = 5;
  uint64_t chunk_bytes = 64ull << 20;
  bool copy_engines = false;
  FlagParser parser(
      "usage: gpu_tier_fetch_bench [--server PATH] [--chunks N] [--chunk-bytes BYTES] [--rounds N] [--nccl-device N]\n"
      "    [--copy-engines (the batched copy and the check after, not the piece copy kernel)]\n");
  parser.AddSwitch("--copy-engines", &copy_engines);
  parser.AddString("--server", &server_binary);
  parser.AddInt("--chunks", &num_chunks);
  parser.AddByteSize("--chunk-bytes", &chunk_bytes);
  parser.AddInt("--rounds", &rounds);
  int nccl_device = -1;
  parser.AddInt("--nccl-device", &nccl_device);
  if (absl::Status s = parser.Parse(argc, argv); !s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return absl::IsCancelled(s) ? 0 : 2;
  }
  auto sink_or = bench::DeviceSink::Create(chunk_bytes + (1 << 20), copy_engines);
  if (!sink_or.ok()) {
    std::fprintf(stderr, "%s\n", sink_or.status().ToString().c_str());
    return 1;
  }
  bench::DeviceSink& sink = **sink_or;
  const uint64_t capacity = (chunk_bytes + (4 << 20)) * static_cast<uint64_t>(num_chunks) * 2;
  ServerProcess server(
      server_binary, {"--listen", "127.0.0.1:0", "--host-capacity", std::to_string(capacity), "--disk-capacity", "0",
                      "--max-chunk-bytes", std::to_string(chunk_bytes + (1 << 20)), "--shm-max-lease-bytes-per-session",
                      // Releases go back on the session's own thread: with 4
                      // fetches in flight, half the chunks' leases were
                      // sometimes still held (2 of 66 fetches refused), and
                      // with 8, 12 chunks once (2 of 240). Host and GPU tier
                      // leases count together: twice the capacity.
                      std::to_string(2 * capacity), "--shm-max-lease-bytes", std::to_string(2 * capacity),
                      "--gpu-capacity", std::to_string(capacity)});
  if (!server.started()) {
    std::fprintf(stderr, "could not start %s (%s)\n", server_binary.c_str(), server.first_line().c_str());
    return 1;
  }
  RemoteTierOptions options;
  options.servers = {server.address()};
  options.holder = "gpu_tier_fetch_bench";
  options.initial_call_deadline = std::chrono::seconds(2);
  options.transport = FetchTransport::kShm;
  options.shm_pinner =
      HostPinner{.pin = [](const void* base, size_t bytes) { return cache::PinHostMemoryReadOnly(base, bytes); },
                 .unpin = [](const void* base) { cache::UnpinHostMemory(const_cast<void*>(base)); }};
  // Each fetch asks for its lease (ShmGet), as before lookups leased ahead.
  options.lookup_lease_hold = std::chrono::milliseconds(0);
  auto host = *RemoteChunkTier::Create(options);  // the server's host RAM over shared memory
  options.gpu_device = 0;
  auto gpu = *RemoteChunkTier::Create(options);  // its GPU tier through CUDA IPC
  // The worker's way: one lookup of a request's chunks leases them, then each fetch reads in place.
  options.lookup_lease_hold = std::chrono::milliseconds(10000);
  auto gpu_ahead = *RemoteChunkTier::Create(options);
  options.gpu_device = -1;
  auto host_ahead = *RemoteChunkTier::Create(options);  // the same from host RAM over shared memory

  uint64_t rng = 42;
  std::vector<std::string> chunks;
  std::vector<Hash128> keys;
  for (int i = 0; i < num_chunks; ++i) {
    chunks.push_back(bench::RandomStoredChunk(chunk_bytes, rng));
    keys.push_back(DecodeChunkHeader(chunks.back())->key);
    if (absl::Status s = host->Publish(keys.back(), Hash128{1, 2}, chunks.back(), 0); !s.ok()) {
      std::fprintf(stderr, "publish: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  // A first read from host RAM promotes each chunk; wait until the GPU tier holds them all.
  const Pass warm_host = FetchAll(*host, chunks, sink, /*check=*/true);
  const auto until = Clock::now() + std::chrono::seconds(20);
  size_t on_gpu = 0;
  while (Clock::now() < until) {
    on_gpu = 0;
    for (const auto& hit : gpu->Lookup(keys)) on_gpu += hit && hit->server_tier == "gpu" ? 1 : 0;
    if (on_gpu == keys.size()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (on_gpu != keys.size()) {
    std::fprintf(stderr, "only %zu of %zu chunks reached the GPU tier\n", on_gpu, keys.size());
    return 1;
  }
  const Pass warm_gpu = FetchAll(*gpu, chunks, sink, /*check=*/true);  // checked byte for byte
  Pass ipc, shm, ahead, shm_ahead;
  double lookup_s = 0;  // the lookups that leased ahead's fetches
  double d2d_s = 0, h2d_s = 0;
  const size_t payload_bytes = chunks[0].size() - kChunkHeaderBytes;
  int ceiling_errors = 0;
  for (int r = 0; r < rounds; ++r) {
    const Pass a = FetchAll(*gpu, chunks, sink, false);
    const Pass b = FetchAll(*host, chunks, sink, false);
    const auto lookup_start = Clock::now();
    const std::vector<std::optional<TierHit>> hits = gpu_ahead->Lookup(keys);
    lookup_s += Seconds(lookup_start);
    ahead.errors += static_cast<int>(std::count(hits.begin(), hits.end(), std::nullopt));
    const Pass c = FetchAll(*gpu_ahead, chunks, sink, /*check=*/r == 0);
    ahead.seconds += c.seconds, ahead.errors += c.errors, ahead.on_device += c.on_device;
    ahead.copy_seconds += c.copy_seconds;
    const std::vector<std::optional<TierHit>> host_hits = host_ahead->Lookup(keys);
    shm_ahead.errors += static_cast<int>(std::count(host_hits.begin(), host_hits.end(), std::nullopt));
    const Pass d = FetchAll(*host_ahead, chunks, sink, /*check=*/r == 0);
    shm_ahead.seconds += d.seconds, shm_ahead.errors += d.errors;
    ipc.seconds += a.seconds, ipc.errors += a.errors, ipc.on_device += a.on_device, ipc.copy_seconds += a.copy_seconds;
    shm.seconds += b.seconds, shm.errors += b.errors, shm.copy_seconds += b.copy_seconds;
    for (int c = 0; c < num_chunks; ++c) {
      auto start = Clock::now();
      ceiling_errors += sink.CopyFromDevice(payload_bytes).ok() ? 0 : 1;
      d2d_s += Seconds(start);
      start = Clock::now();
      ceiling_errors += sink.CopyFromPinned(payload_bytes).ok() ? 0 : 1;
      h2d_s += Seconds(start);
    }
  }
  // Fetches in flight (the worker's pipeline fetches on several threads), a sink each: one
  // chunk's ShmGet round trip overlaps the others' copies. The threads take the fetches from
  // one counter, so none is left with more than its share (with 6 chunks striped over 4
  // threads, two threads did twice the others' fetches), and there are at least 240 of them
  // (30 took 5-9 ms in all, where one thread's first call weighs).
  const std::vector<int> in_flight_counts = {4, 8};
  std::vector<double> in_flight_gbps;
  for (const int in_flight : in_flight_counts) {
    std::vector<std::unique_ptr<bench::DeviceSink>> sinks;
    for (int t = 0; t < in_flight; ++t) {
      auto extra = bench::DeviceSink::Create(chunk_bytes + (1 << 20), copy_engines);
      if (extra.ok()) sinks.push_back(*std::move(extra));
    }
    std::atomic<int> failed{0};
    std::atomic<size_t> next{0};
    const size_t fetches = std::max<size_t>(240, static_cast<size_t>(rounds) * chunks.size());
    const auto start = Clock::now();
    std::vector<std::thread> threads;
    for (size_t t = 0; t < sinks.size(); ++t) {
      threads.emplace_back([&, t] {
        for (size_t i = next++; i < fetches; i = next++) {
          failed += FetchAll(*gpu, std::span(&chunks[i % chunks.size()], 1), *sinks[t], false).errors;
        }
      });
    }
    for (std::thread& thread : threads) thread.join();
    in_flight_gbps.push_back(static_cast<double>(payload_bytes) * fetches / Seconds(start) / 1e9);
    ceiling_errors += failed.load() + (static_cast<int>(sinks.size()) == in_flight ? 0 : 1);
  }
  const double bytes = static_cast<double>(payload_bytes) * num_chunks * rounds;
  const TransportStats s = gpu->transport_stats();
  std::printf("GPU tier fetch of %d x %s chunks, %d rounds, on %s (server %s)\n", num_chunks,
              FormatByteSize(chunks[0].size()).c_str(), rounds, sink.Describe().c_str(), server.address().c_str());
  std::printf("%-22s %10s %10s\n", "path", "GB/s", "vs_ceiling");
  const double d2d = bytes / d2d_s / 1e9, h2d = bytes / h2d_s / 1e9;
  std::printf("%-22s %10.2f %9.0f%%\n", "cuda_ipc fetch+copy", bytes / ipc.seconds / 1e9,
              100 * bytes / ipc.seconds / 1e9 / d2d);
  std::printf("%-22s %10.2f %9.0f%%\n", "  of which the copy", bytes / ipc.copy_seconds / 1e9,
              100 * bytes / ipc.copy_seconds / 1e9 / d2d);
  std::printf("%-22s %10.2f %9.0f%%   (each fetch after one lookup of the round's chunks leased them)\n",
              "cuda_ipc after lookup", bytes / ahead.seconds / 1e9, 100 * bytes / ahead.seconds / 1e9 / d2d);
  std::printf("%-22s %10.2f %9.0f%%   (the lookups too: %.0f us for %d chunks)\n", "  lookup + fetches",
              bytes / (ahead.seconds + lookup_s) / 1e9, 100 * bytes / (ahead.seconds + lookup_s) / 1e9 / d2d,
              1e6 * lookup_s / rounds, num_chunks);
  for (size_t i = 0; i < in_flight_counts.size(); ++i) {
    const std::string label = "cuda_ipc x" + std::to_string(in_flight_counts[i]) + " in flight";
    std::printf("%-22s %10.2f %9.0f%%\n", label.c_str(), in_flight_gbps[i], 100 * in_flight_gbps[i] / d2d);
  }
  std::printf("%-22s %10.2f %10s\n", "d2d cudaMemcpy", d2d, "100%");
  std::printf("%-22s %10.2f %9.0f%%\n", "shm fetch+copy", bytes / shm.seconds / 1e9,
              100 * bytes / shm.seconds / 1e9 / h2d);
  std::printf("%-22s %10.2f %9.0f%%   (each fetch after one lookup leased the round's chunks in host RAM)\n",
              "shm after lookup", bytes / shm_ahead.seconds / 1e9, 100 * bytes / shm_ahead.seconds / 1e9 / h2d);
  std::printf("%-22s %10.2f %10s\n", "pinned h2d", h2d, "100%");
  const int errors =
      warm_host.errors + warm_gpu.errors + ipc.errors + shm.errors + ahead.errors + shm_ahead.errors + ceiling_errors;
  const TransportStats a = gpu_ahead->transport_stats();
  const bool all_on_device = warm_gpu.on_device == num_chunks && ipc.on_device == num_chunks * rounds &&
                             s.shm_chunks == 0 && ahead.on_device == num_chunks * rounds;
  std::printf("after a lookup: %llu of %d fetches took the lookup's lease (%llu unused)\n",
              static_cast<unsigned long long>(a.lookup_leases_used), num_chunks * rounds,
              static_cast<unsigned long long>(a.lookup_leases_unused));
  std::printf("cuda_ipc fetches %llu (payload on the GPU: %s); byte-exact check of the first round: %s; errors %d\n",
              static_cast<unsigned long long>(s.cuda_ipc_chunks), all_on_device ? "every one" : "NOT ALL",
              warm_gpu.errors + warm_host.errors == 0 ? "ok" : "FAILED", errors);
  int nccl_errors = 0;
  if (nccl_device >= 0) nccl_errors = NcclPass(server.address(), chunks, rounds, nccl_device);
  return errors == 0 && nccl_errors == 0 && all_on_device ? 0 : 1;
}

}  // namespace
}  // namespace lazykv

int main(int argc, char** argv) {
  lazykv::TuneMallocForLargeBuffers();
  return lazykv::Main(argc, argv);
}
