// Same-host fetch throughput (issue 17): 64 MiB chunks from a real lazykv-cache-server on
// this machine, over the shared-memory transport (the chunk read in place from the
// server's host arena under a read lease) and over gRPC on loopback (streamed, copied
// into a string), in the same run, alternating round by round. Each fetched chunk is
// consumed by one copy into a destination buffer (the stand-in for the host-to-device
// copy the engine makes), and a plain memcpy of the same bytes is the ceiling. Reported:
// GB/s of the fetch alone (until the bytes are usable) and of fetch + copy. Publishing the
// same chunks is timed too: written in place into pages the server reserved and committed
// (shm), against a buffer streamed by Put (grpc), each from the bench's own memory.
//
// With --device (a CUDA build on a GPU machine) the copy goes to device memory as the
// backend's staging does it (the worker's mapping page-locked, a copy per piece, the value
// check on the device), against the same copy from a pinned buffer of the bench's own;
// and then with two fetches in flight (two threads, each its own stream), as the worker's
// chunk pipeline fetches on several threads, so one chunk's ShmGet overlaps another's copy.
//
//   shm_fetch_bench [--server PATH] [--chunks N] [--chunk-bytes BYTES] [--rounds N] [--device [--copy-engines]]
#include <grpcpp/grpcpp.h>
#include <unistd.h>

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

struct Timing {
  double fetch_s = 0;  // until the bytes are usable
  double total_s = 0;  // fetch + one copy into the destination
  int errors = 0;
};

// Fetches every chunk once through `tier` and copies it into `dst`, or hands its payload
// to `device` when there is one.
Timing FetchAll(RemoteChunkTier& tier, std::span<const std::string> chunks, std::string& dst, bool check,
                bench::DeviceSink* device = nullptr) {
  Timing t;
  for (const std::string& chunk : chunks) {
    const Hash128 key = DecodeChunkHeader(chunk)->key;
    const auto start = Clock::now();
    auto fetched = tier.Fetch(key);
    const double fetched_s = Seconds(start);
    if (!fetched.ok() || fetched->stored.size() != chunk.size()) {
      ++t.errors;
      continue;
    }
    if (device != nullptr) {
      const ChunkBytes payload = fetched->stored.Slice(kChunkHeaderBytes, fetched->stored.size());
      if (absl::Status s = device->Consume(payload.pieces()); !s.ok()) {
        std::fprintf(stderr, "device copy: %s\n", std::string(s.message()).c_str());
        ++t.errors;
      }
    } else {
      fetched->stored.CopyTo(0, chunk.size(), dst.data());
    }
    t.total_s += Seconds(start);
    t.fetch_s += fetched_s;
    if (check && std::memcmp(dst.data(), chunk.data(), chunk.size()) != 0) ++t.errors;
  }
  return t;
}

// Wall seconds for `rounds` passes over `chunks` through `tier` by one thread per sink
// (thread t takes chunks t, t + n, ...); errors counted into *errors.
double FetchInParallel(RemoteChunkTier& tier, const std::vector<std::string>& chunks, int rounds,
                       const std::vector<std::unique_ptr<bench::DeviceSink>>& sinks, int* errors) {
  std::atomic<int> failed{0};
  const auto start = Clock::now();
  std::vector<std::thread> threads;
  for (size_t t = 0; t < sinks.size(); ++t) {
    threads.emplace_back([&, t] {
      std::string unused;
      for (int r = 0; r < rounds; ++r) {
        for (size_t c = t; c < chunks.size(); c += sinks.size()) {
          failed += FetchAll(tier, std::span(&chunks[c], 1), unused, false, sinks[t].get()).errors;
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  *errors += failed.load();
  return Seconds(start);
}

int Main(int argc, char** argv) {
  std::error_code ec;
  std::string server_binary =
      (std::filesystem::read_symlink("/proc/self/exe", ec).parent_path() / "lazykv-cache-server").string();
  int num_chunks = 6;
  uint64_t chunk_bytes = 64ull << 20;
  int rounds = 5;
  bool to_device = false, copy_engines = false;
  FlagParser parser(
      "usage: shm_fetch_bench [--server PATH] [--chunks N] [--chunk-bytes BYTES] [--rounds N] [--device "
      "[--copy-engines]]\n");
  parser.AddSwitch("--device", &to_device);
  parser.AddSwitch("--copy-engines", &copy_engines);
  parser.AddString("--server", &server_binary);
  parser.AddInt("--chunks", &num_chunks);
  parser.AddByteSize("--chunk-bytes", &chunk_bytes);
  parser.AddInt("--rounds", &rounds);
  if (absl::Status s = parser.Parse(argc, argv); !s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return absl::IsCancelled(s) ? 0 : 2;
  }
  const uint64_t capacity = (chunk_bytes + (1 << 20)) * static_cast<uint64_t>(num_chunks) * 2;
  ServerProcess server(
      server_binary, {"--listen", "127.0.0.1:0", "--host-capacity", std::to_string(capacity), "--disk-capacity", "0",
                      "--max-chunk-bytes", std::to_string(chunk_bytes + (1 << 20)), "--shm-max-lease-bytes-per-session",
                      std::to_string(capacity / 2)});
  if (!server.started()) {
    std::fprintf(stderr, "could not start %s (%s)\n", server_binary.c_str(), server.first_line().c_str());
    return 1;
  }
  RemoteTierOptions options;
  options.servers = {server.address()};
  options.holder = "shm_fetch_bench";
  options.initial_call_deadline = std::chrono::seconds(2);
  options.transport = FetchTransport::kShm;
  std::unique_ptr<bench::DeviceSink> device;
  if (to_device) {
    auto sink = bench::DeviceSink::Create(chunk_bytes + (1 << 20), copy_engines);
    if (!sink.ok()) {
      std::fprintf(stderr, "%s\n", std::string(sink.status().message()).c_str());
      return 1;
    }
    device = *std::move(sink);
    // The worker's page-locking of the mapped arena (worker/setup/model_setup.cc).
    options.shm_pinner =
        HostPinner{.pin = [](const void* base, size_t bytes) { return cache::PinHostMemoryReadOnly(base, bytes); },
                   .unpin = [](const void* base) { cache::UnpinHostMemory(const_cast<void*>(base)); }};
  }
  auto shm = *RemoteChunkTier::Create(options);
  options.shm_pinner = {};
  options.transport = FetchTransport::kGrpc;
  auto grpc = *RemoteChunkTier::Create(options);

  uint64_t rng = 42;
  std::vector<std::string> chunks;
  for (int i = 0; i < num_chunks; ++i) {
    chunks.push_back(bench::RandomStoredChunk(chunk_bytes, rng));
    if (absl::Status s = grpc->Publish(DecodeChunkHeader(chunks.back())->key, Hash128{1, 2}, chunks.back(), 0);
        !s.ok()) {
      std::fprintf(stderr, "put failed: %s\n", std::string(s.message()).c_str());
      return 1;
    }
  }
  std::string dst(chunks[0].size(), '\0');
  std::memcpy(dst.data(), chunks[0].data(), dst.size());  // fault the destination in
  // The ceiling: the same copy from the bench's own (warm) memory.
  double memcpy_s = 0;
  for (int r = 0; r < rounds; ++r) {
    for (const std::string& chunk : chunks) {
      const auto start = Clock::now();
      std::memcpy(dst.data(), chunk.data(), chunk.size());
      memcpy_s += Seconds(start);
    }
  }
  // Warm-up round for both (session, connection, the server's pages), checked byte for byte.
  Timing warm_shm = FetchAll(*shm, chunks, dst, /*check=*/true);
  Timing warm_grpc = FetchAll(*grpc, chunks, dst, /*check=*/true);
  Timing shm_t, grpc_t;
  double pinned_s = 0;
  const size_t payload_bytes = chunks[0].size() - kChunkHeaderBytes;
  if (device != nullptr) {  // warm the device path up too
    (void)FetchAll(*shm, chunks, dst, false, device.get());
    (void)FetchAll(*grpc, chunks, dst, false, device.get());
  }
  for (int r = 0; r < rounds; ++r) {
    const Timing a = FetchAll(*shm, chunks, dst, false, device.get());
    const Timing b = FetchAll(*grpc, chunks, dst, false, device.get());
    for (size_t c = 0; device != nullptr && c < chunks.size(); ++c) {
      const auto start = Clock::now();
      if (!device->CopyFromPinned(payload_bytes).ok()) ++shm_t.errors;
      pinned_s += Seconds(start);
    }
    shm_t.fetch_s += a.fetch_s, shm_t.total_s += a.total_s, shm_t.errors += a.errors;
    grpc_t.fetch_s += b.fetch_s, grpc_t.total_s += b.total_s, grpc_t.errors += b.errors;
  }
  // Publishing: delete, then put every chunk again through each transport in turn.
  auto stub = v1::KvCache::NewStub(grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
  auto delete_all = [&] {
    v1::DeleteRequest request;
    for (const std::string& chunk : chunks) {
      const Hash128 key = DecodeChunkHeader(chunk)->key;
      v1::Hash128* k = request.add_keys();
      k->set_high(key.high);
      k->set_low(key.low);
    }
    grpc::ClientContext context;
    v1::DeleteResponse response;
    (void)stub->Delete(&context, request, &response);
  };
  auto publish_all = [&](RemoteChunkTier& tier, int& errors) {
    delete_all();
    double seconds = 0;
    for (const std::string& chunk : chunks) {
      const Hash128 key = DecodeChunkHeader(chunk)->key;
      const auto start = Clock::now();
      auto slot = tier.BeginPublish(key, Hash128{1, 2}, chunk.size(), 0);
      if (!slot.ok()) {
        ++errors;
        continue;
      }
      WriteToPieces((*slot)->Pieces(), 0, chunk);
      if (!(*slot)->Commit().ok()) ++errors;
      seconds += Seconds(start);
    }
    return seconds;
  };
  int publish_errors = 0;
  double publish_shm_s = 0, publish_grpc_s = 0;
  (void)publish_all(*shm, publish_errors);  // warm-up
  (void)publish_all(*grpc, publish_errors);
  for (int r = 0; r < rounds; ++r) {
    publish_shm_s += publish_all(*shm, publish_errors);
    publish_grpc_s += publish_all(*grpc, publish_errors);
  }
  const uint64_t published_over_shm = shm->transport_stats().shm_published_chunks;
  // Two fetches in flight (the chunks were published again above, so they are in RAM).
  double parallel_s = 0;
  int parallel_errors = 0;
  if (device != nullptr) {
    std::vector<std::unique_ptr<bench::DeviceSink>> sinks;
    sinks.push_back(std::move(device));
    auto second = bench::DeviceSink::Create(chunk_bytes + (1 << 20), copy_engines);
    if (second.ok()) {
      sinks.push_back(*std::move(second));
      (void)FetchInParallel(*shm, chunks, 1, sinks, &parallel_errors);  // warm-up
      parallel_s = FetchInParallel(*shm, chunks, rounds, sinks, &parallel_errors);
    }
    device = std::move(sinks[0]);
  }

  const double bytes = static_cast<double>(chunks[0].size()) * num_chunks * rounds;
  const TransportStats s = shm->transport_stats();
  std::printf("same-host fetch of %d x %s chunks, %d rounds (server %s, %u CPUs)\n", num_chunks,
              FormatByteSize(chunks[0].size()).c_str(), rounds, server.address().c_str(),
              std::thread::hardware_concurrency());
  const bool dev = device != nullptr;
  if (dev)
    std::printf("copies go to device memory: %s (the worker's mapping page-locked)\n", device->Describe().c_str());
  std::printf("%-10s %12s %16s %14s\n", "transport", "fetch_GB/s", dev ? "fetch+device_GB/s" : "fetch+copy_GB/s",
              dev ? "vs_pinned_h2d" : "vs_memcpy");
  // The ceiling: a memcpy on the host; with --device, pinned host to device.
  const double copy_gbps =
      dev ? static_cast<double>(payload_bytes) * num_chunks * rounds / pinned_s / 1e9 : bytes / memcpy_s / 1e9;
  std::printf("%-10s %12.2f %16.2f %13.0f%%%s\n", "shm", bytes / shm_t.fetch_s / 1e9, bytes / shm_t.total_s / 1e9,
              100 * (bytes / shm_t.total_s / 1e9) / copy_gbps, shm_t.errors + warm_shm.errors ? "  (errors!)" : "");
  std::printf("%-10s %12.2f %16.2f %13.0f%%%s\n", "grpc", bytes / grpc_t.fetch_s / 1e9, bytes / grpc_t.total_s / 1e9,
              100 * (bytes / grpc_t.total_s / 1e9) / copy_gbps, grpc_t.errors + warm_grpc.errors ? "  (errors!)" : "");
  if (parallel_s > 0) {
    std::printf("%-10s %12s %16.2f %13.0f%%%s\n", "shm_x2", "-", bytes / parallel_s / 1e9,
                100 * (bytes / parallel_s / 1e9) / copy_gbps, parallel_errors ? "  (errors!)" : "");
  }
  std::printf("%-10s %12s %16.2f %13s\n", dev ? "pinned_h2d" : "memcpy", "-", copy_gbps, "100%");
  std::printf("publish: shm %.2f GB/s (%llu committed in place), grpc %.2f GB/s%s\n", bytes / publish_shm_s / 1e9,
              static_cast<unsigned long long>(published_over_shm), bytes / publish_grpc_s / 1e9,
              publish_errors ? "  (errors!)" : "");
  std::printf("shm fetches %llu (fallbacks %llu); byte-exact check of the first round: %s\n",
              static_cast<unsigned long long>(s.shm_chunks), static_cast<unsigned long long>(s.shm_fallbacks),
              warm_shm.errors + warm_grpc.errors == 0 ? "ok" : "FAILED");
  return shm_t.errors + grpc_t.errors + warm_shm.errors + warm_grpc.errors + publish_errors + parallel_errors == 0 ? 0
                                                                                                                   : 1;
}

}  // namespace
}  // namespace lazykv

int main(int argc, char** argv) {
  lazykv::TuneMallocForLargeBuffers();
  return lazykv::Main(argc, argv);
}
