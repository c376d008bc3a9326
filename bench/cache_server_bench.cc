// Cache server throughput over loopback (issue: put/get GB/s with 1, 4 and 16 streams,
// 1 MiB and 32 MiB chunks, and batched lookups per second), against the raw memory copy
// rate of the same bytes measured in the same run. It starts a real lazykv-cache-server
// (host RAM tier only, so that the disk does not set the pace) and talks to it through
// the worker's own client (RemoteChunkTier).
//
//   cache_server_bench [--server PATH] [--bytes-per-config BYTES]
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>

#include "bench/random_chunk_payload.h"
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

// Stored chunks of `payload_bytes` sharing one random payload, each under its own key.
std::vector<std::string> MakeChunks(size_t count, size_t payload_bytes, uint64_t& rng) {
  const ChunkLayout layout = bench::BenchLayout(payload_bytes);
  const std::string payload = bench::RandomPayload(layout, rng);
  const Hash128 fingerprint{1, 2};
  ChunkHeader header = MakeChunkHeader(Hash128{}, fingerprint, layout, payload);
  std::vector<std::string> chunks;
  for (size_t i = 0; i < count; ++i) {
    header.key = Hash128{SplitMix64(rng), SplitMix64(rng)};
    chunks.push_back(EncodeChunk(header, payload));
  }
  return chunks;
}

Hash128 KeyOf(const std::string& stored) { return DecodeChunkHeader(stored)->key; }

// Runs fn(stream) on `streams` threads that start together; returns the wall time.
template <typename Fn>
double RunStreams(int streams, Fn fn) {
  std::barrier start(streams + 1);
  std::vector<std::thread> threads;
  for (int s = 0; s < streams; ++s) {
    threads.emplace_back([&, s] {
      start.arrive_and_wait();
      fn(s);
    });
  }
  start.arrive_and_wait();
  const auto t0 = Clock::now();
  for (auto& t : threads) t.join();
  return Seconds(t0);
}

// The baseline: one thread copying the same bytes, chunk by chunk, between two buffers.
double MemcpyGBps(size_t chunk_bytes, size_t total_bytes) {
  std::string src(chunk_bytes, 'x'), dst(chunk_bytes, 'y');
  std::memcpy(dst.data(), src.data(), chunk_bytes);  // fault the pages in
  const auto t0 = Clock::now();
  for (size_t done = 0; done < total_bytes; done += chunk_bytes) {
    src[done % chunk_bytes] = static_cast<char>(done);
    std::memcpy(dst.data(), src.data(), chunk_bytes);
  }
  const double s = Seconds(t0);
  return dst[0] == 'z' ? 0 : total_bytes / s / 1e9;
}

int Main(int argc, char** argv) {
  std::error_code ec;
  std::string server_binary =
      (std::filesystem::read_symlink("/proc/self/exe", ec).parent_path() / "lazykv-cache-server").string();
  uint64_t bytes_per_config = 512ull << 20;
  FlagParser parser("usage: cache_server_bench [--server PATH] [--bytes-per-config BYTES]\n");
  parser.AddString("--server", &server_binary);
  parser.AddByteSize("--bytes-per-config", &bytes_per_config);
  if (absl::Status s = parser.Parse(argc, argv); !s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return absl::IsCancelled(s) ? 0 : 2;
  }
  ServerProcess server(server_binary, {"--listen", "127.0.0.1:0", "--host-capacity", "3GiB", "--disk-capacity", "0",
                                       "--max-streams", "64", "--max-chunk-bytes", "64MiB"});
  if (!server.started()) {
    std::fprintf(stderr, "could not start %s (%s)\n", server_binary.c_str(), server.first_line().c_str());
    return 1;
  }
  // Lookups lease nothing here: the lookup rate is that of the index, as before lookups leased.
  // Assigned member by member: a designated temporary sets off GCC 12's -Wmaybe-uninitialized in
  // the string members it leaves defaulted.
  RemoteTierOptions tier_options;
  tier_options.servers = {server.address()};
  tier_options.holder = "bench";
  tier_options.lookup_lease_hold = std::chrono::milliseconds(0);
  auto tier = *RemoteChunkTier::Create(std::move(tier_options));
  // For Delete between configurations (the worker's client has no use for it).
  auto stub = v1::KvCache::NewStub(grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
  const Hash128 fingerprint{1, 2};
  uint64_t rng = 42;
  std::printf("cache server over loopback (%s), %u CPUs; host RAM tier only\n", server.address().c_str(),
              std::thread::hardware_concurrency());
  std::printf("%-6s %-7s %7s %10s %10s %11s %9s %9s\n", "chunk", "streams", "chunks", "put_GB/s", "get_GB/s",
              "memcpy_GB/s", "put/copy", "get/copy");
  for (size_t chunk : {size_t(1) << 20, size_t(32) << 20}) {
    for (int streams : {1, 4, 16}) {
      const size_t per_stream = std::max<size_t>(2, bytes_per_config / chunk / streams);
      std::vector<std::vector<std::string>> chunks(streams);
      for (auto& c : chunks) c = MakeChunks(per_stream, chunk, rng);
      const size_t stored_bytes = chunks[0][0].size();
      const double total = static_cast<double>(stored_bytes) * per_stream * streams;
      std::atomic<int> errors = 0;
      const double put_s = RunStreams(streams, [&](int s) {
        for (const std::string& c : chunks[s]) {
          if (!tier->Publish(KeyOf(c), fingerprint, c, 0).ok()) ++errors;
        }
      });
      const double get_s = RunStreams(streams, [&](int s) {
        for (const std::string& c : chunks[s]) {
          auto got = tier->Fetch(KeyOf(c));
          if (!got.ok() || got->stored.size() != c.size()) ++errors;
        }
      });
      const double copy = MemcpyGBps(stored_bytes, static_cast<size_t>(total));
      std::printf("%-6s %-7d %7zu %10.2f %10.2f %11.2f %8.0f%% %8.0f%%%s\n", FormatByteSize(chunk).c_str(), streams,
                  per_stream * streams, total / put_s / 1e9, total / get_s / 1e9, copy,
                  100 * total / put_s / 1e9 / copy, 100 * total / get_s / 1e9 / copy, errors ? "  (errors!)" : "");
      // Free the server's RAM for the next configuration.
      v1::DeleteRequest del;
      for (const auto& stream : chunks) {
        for (const std::string& c : stream) {
          const Hash128 key = KeyOf(c);
          v1::Hash128* k = del.add_keys();
          k->set_high(key.high);
          k->set_low(key.low);
        }
      }
      grpc::ClientContext context;
      v1::DeleteResponse deleted;
      (void)stub->Delete(&context, del, &deleted);
    }
  }

  // Batched lookups: 1000 keys a call, half of them stored.
  auto stored = MakeChunks(500, 4096, rng);
  for (const std::string& c : stored) (void)tier->Publish(KeyOf(c), fingerprint, c, 0);
  std::vector<Hash128> keys;
  for (size_t i = 0; i < 1000; ++i) keys.push_back(i % 2 ? KeyOf(stored[i / 2]) : Hash128{SplitMix64(rng), 7});
  for (int streams : {1, 4}) {
    std::atomic<uint64_t> looked_up = 0;
    const double s = RunStreams(streams, [&](int) {
      const auto until = Clock::now() + std::chrono::seconds(2);
      while (Clock::now() < until) {
        const auto found = tier->Lookup(keys);
        looked_up += found.size();
      }
    });
    std::printf("batched lookups, 1000 keys a call, %d stream(s): %.0f keys/s\n", streams, looked_up / s);
  }
  return 0;
}

}  // namespace
}  // namespace lazykv

int main(int argc, char** argv) {
  lazykv::TuneMallocForLargeBuffers();
  return lazykv::Main(argc, argv);
}
