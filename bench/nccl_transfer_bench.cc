// A chunk from GPU 0 to GPU 1, as the cache server's GPU tier hands one to a worker on another
// GPU: the "nccl" peer link moving the chunk as a list of pieces (the paged tier's pages,
// each its own allocation; the link gathers them) and as one piece (a chunk in one run of
// pages) against, in the same run, raw NCCL send/receive of one contiguous
// buffer (nccl-tests style), cudaMemcpyPeerAsync with peer access on, and a device-to-device
// copy on GPU 1 (the local ceiling). One process: the receiver on the main thread, the
// sender on the link's own thread (a second thread for raw NCCL).
//
// Each method reports two figures, GB = 1e9 bytes: per transfer (the median over
// --iterations of the receiver's time from posting a receive to its return, the sender
// posting continuously) and pipelined (--iterations transfers back to back: total bytes over
// total time). The last peer-link transfer is compared byte for byte with the source; a
// mismatch or any error exits 1.
//
//   nccl_transfer_bench [--chunk-mib 64] [--piece-mib 2] [--iterations 50] [--warmup 5] [--json PATH]
#include <cuda_runtime.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "bench/cuda_bench_util.h"
#include "common/flag_parser.h"
#include "common/peer_link/nccl_library.h"
#include "common/peer_link/peer_link.h"
#include "common/splitmix64.h"
#include "nlohmann/json.hpp"

namespace lazykv {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) { return std::chrono::duration<double>(Clock::now() - since).count(); }

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "nccl_transfer_bench: %s\n", what.c_str());
  std::exit(1);
}

#define CHECK_NCCL(api, expr)                             \
  do {                                                    \
    ncclResult_t r_ = (expr);                               \
    if (r_ != ncclSuccess) Fail((api).Describe(#expr, r_)); \
  } while (0)

struct Result {
  double per_transfer_gbps = 0;  // median over the timed transfers
  double pipelined_gbps = 0;     // back to back
};

struct Options {
  uint64_t chunk = 0;
  uint64_t piece = 0;
  int iterations = 0;
  int warmup = 0;
};

double Median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// Per-transfer and pipelined figures for a method given as `one` (a single transfer that
// returns when it is complete on the receiver) and `launch`/`wait` (issue one without
// waiting; wait for all issued).
Result Measure(const Options& o, const std::function<void()>& one, const std::function<void()>& launch,
               const std::function<void()>& wait) {
  for (int i = 0; i < o.warmup; ++i) one();
  std::vector<double> times;
  for (int i = 0; i < o.iterations; ++i) {
    const auto start = Clock::now();
    one();
    times.push_back(Seconds(start));
  }
  const auto start = Clock::now();
  for (int i = 0; i < o.iterations; ++i) launch();
  wait();
  const double total = Seconds(start);
  return {static_cast<double>(o.chunk) / Median(times) / 1e9,
          static_cast<double>(o.chunk) * o.iterations / total / 1e9};
}

// The same for a method whose single transfer is a launch followed by a wait.
Result Measure(const Options& o, const std::function<void()>& launch, const std::function<void()>& wait) {
  return Measure(
      o,
      [&] {
        launch();
        wait();
      },
      launch, wait);
}

// The peer link: the sender queues every transfer at once; the receiver times its Recvs.
// `target` is GPU 1's contiguous buffer, received in pieces of the sender's sizes. Exits on
// any error, or when the last transfer's bytes differ from `host`.
Result PeerLinkTransfers(const Options& o, const std::vector<char*>& pieces, const std::vector<size_t>& sizes,
                         char* target, const std::string& host) {
  const PeerLinkOptions sender_options{.kind = "nccl", .device = 0, .cancel = nullptr};
  const PeerLinkOptions receiver_options{.kind = "nccl", .device = 1, .cancel = nullptr};
  absl::StatusOr<std::string> id = NewPeerLinkId(sender_options);
  if (!id.ok()) Fail(id.status().ToString());
  const auto join_deadline = PeerLinkClock::now() + std::chrono::seconds(60);
  absl::StatusOr<std::unique_ptr<PeerLink>> sender;
  std::thread join([&] { sender = ConnectPeerLink(sender_options, *id, 0, join_deadline); });
  absl::StatusOr<std::unique_ptr<PeerLink>> receiver = ConnectPeerLink(receiver_options, *id, 1, join_deadline);
  join.join();
  if (!sender.ok()) Fail("sender: " + sender.status().ToString());
  if (!receiver.ok()) Fail("receiver: " + receiver.status().ToString());

  std::vector<std::string_view> source;
  std::vector<std::span<char>> spans;
  size_t offset = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    source.emplace_back(pieces[i], sizes[i]);
    spans.emplace_back(target + offset, sizes[i]);
    offset += sizes[i];
  }
  // warm-up, timed one by one, pipelined, and the checked last one
  const int total = o.warmup + 2 * o.iterations + 1;
  std::atomic<int> sent{0}, failed{0};
  for (int i = 0; i < total; ++i) {
    (*sender)->Send(source, PeerLinkClock::now() + std::chrono::seconds(120), [&](absl::Status s) {
      if (!s.ok()) {
        std::fprintf(stderr, "send: %s\n", s.ToString().c_str());
        failed.fetch_add(1);
      }
      sent.fetch_add(1);
    });
  }
  auto recv = [&] {
    absl::Status s = (*receiver)->Recv(spans, PeerLinkClock::now() + std::chrono::seconds(30));
    if (!s.ok()) Fail("recv: " + s.ToString());
  };
  // The link's Recv blocks: "launch" is the whole receive and "wait" has nothing left.
  const Result result = Measure(o, recv, recv, [] {});
  CHECK_CUDA(cudaSetDevice(1));
  CHECK_CUDA(cudaMemset(target, 0, o.chunk));
  CHECK_CUDA(cudaDeviceSynchronize());
  recv();
  std::string back(o.chunk, '\0');
  CHECK_CUDA(cudaMemcpy(back.data(), target, o.chunk, cudaMemcpyDeviceToHost));
  if (back != host) {
    size_t first = 0;
    while (first < back.size() && back[first] == host[first]) ++first;
    Fail("CORRUPTION: the last peer-link transfer differs from the source at byte " + std::to_string(first));
  }
  const auto until = Clock::now() + std::chrono::seconds(10);
  while (sent.load() < total && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (sent.load() < total || failed.load() > 0) {
    Fail("peer-link sends: " + std::to_string(sent.load()) + " of " + std::to_string(total) + " done, " +
         std::to_string(failed.load()) + " failed");
  }
  return result;
}

// Raw NCCL, nccl-tests style: a blocking two-rank communicator, one ncclSend/ncclRecv of
// the whole contiguous chunk per transfer, the sender on its own thread launching all of
// its sends back to back.
// With `blocking` false, communicators as the peer link makes them (non-blocking: each call
// may answer ncclInProgress, and is polled to its end before the next), to tell the cost of
// that mode apart from the link's own.
Result RawNccl(const Options& o, const NcclApi& nccl, char* source, char* target, bool blocking = true) {
  ncclUniqueId id;
  CHECK_NCCL(nccl, nccl.GetUniqueId(&id));
  ncclComm_t comms[2] = {nullptr, nullptr};
  auto settle = [&](ncclComm_t comm) {
    if (blocking) return;
    ncclResult_t state = ncclInProgress;
    do {
      CHECK_NCCL(nccl, nccl.CommGetAsyncError(comm, &state));
    } while (state == ncclInProgress);
    CHECK_NCCL(nccl, state);
  };
  auto init = [&](int rank) {
    CHECK_CUDA(cudaSetDevice(rank));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    if (!blocking) config.blocking = 0;
    const ncclResult_t result = nccl.CommInitRankConfig(&comms[rank], 2, id, rank, &config);
    if (result != ncclInProgress) CHECK_NCCL(nccl, result);
    settle(comms[rank]);
  };
  std::thread peer(init, 0);
  init(1);
  peer.join();
  const int total = o.warmup + 2 * o.iterations;
  std::thread sender([&] {
    CHECK_CUDA(cudaSetDevice(0));
    cudaStream_t stream;
    CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    for (int i = 0; i < total; ++i) {
      const ncclResult_t result = nccl.Send(source, o.chunk, ncclUint8, 1, comms[0], stream);
      if (result != ncclInProgress) CHECK_NCCL(nccl, result);
      settle(comms[0]);
    }
    CHECK_CUDA(cudaStreamSynchronize(stream));
    CHECK_CUDA(cudaStreamDestroy(stream));
  });
  CHECK_CUDA(cudaSetDevice(1));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto launch = [&] {
    const ncclResult_t result = nccl.Recv(target, o.chunk, ncclUint8, 0, comms[1], stream);
    if (result != ncclInProgress) CHECK_NCCL(nccl, result);
    settle(comms[1]);
  };
  auto wait = [&] { CHECK_CUDA(cudaStreamSynchronize(stream)); };
  const Result result = Measure(o, launch, wait);
  sender.join();
  CHECK_CUDA(cudaStreamDestroy(stream));
  for (ncclComm_t comm : comms) CHECK_NCCL(nccl, nccl.CommDestroy(comm));
  return result;
}

// A copy on a stream of `device`, timed as Measure does.
Result Copies(const Options& o, int device, const std::function<cudaError_t(cudaStream_t)>& copy) {
  CHECK_CUDA(cudaSetDevice(device));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto launch = [&] { CHECK_CUDA(copy(stream)); };
  auto wait = [&] { CHECK_CUDA(cudaStreamSynchronize(stream)); };
  const Result result = Measure(o, launch, wait);
  CHECK_CUDA(cudaStreamDestroy(stream));
  return result;
}

void EnablePeerAccess(int device, int peer) {
  CHECK_CUDA(cudaSetDevice(device));
  const cudaError_t enabled = cudaDeviceEnablePeerAccess(peer, 0);
  if (enabled == cudaErrorPeerAccessAlreadyEnabled) {
    (void)cudaGetLastError();  // NCCL turned it on in this process already
  } else {
    CHECK_CUDA(enabled);
  }
}

int Main(int argc, char** argv) {
  // Before anything loads NCCL: a two-rank point-to-point link never needs NVLink multicast,
  // and the machines we run on require it off (nccl_library.cc sets the same default).
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
  int chunk_mib = 64, piece_mib = 2, iterations = 50, warmup = 5;
  std::string json_path;
  FlagParser parser(
      "usage: nccl_transfer_bench [--chunk-mib 64] [--piece-mib 2] [--iterations 50] [--warmup 5] [--json PATH]\n");
  parser.AddInt("--chunk-mib", &chunk_mib);
  parser.AddInt("--piece-mib", &piece_mib);
  parser.AddInt("--iterations", &iterations);
  parser.AddInt("--warmup", &warmup);
  parser.AddString("--json", &json_path);
  if (absl::Status s = parser.Parse(argc, argv); !s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return absl::IsCancelled(s) ? 0 : 2;
  }
  if (chunk_mib < 1 || piece_mib < 1 || iterations < 1 || warmup < 0) {
    std::fprintf(stderr, "nccl_transfer_bench: --chunk-mib, --piece-mib and --iterations must be positive\n");
    return 2;
  }
  const Options o{.chunk = uint64_t(chunk_mib) << 20,
                  .piece = uint64_t(piece_mib) << 20,
                  .iterations = iterations,
                  .warmup = warmup};
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus < 2) Fail("needs two GPUs, found " + std::to_string(gpus));
  if (absl::Status s = PeerLinkAvailable("nccl"); !s.ok()) Fail("no NCCL: " + s.ToString());
  absl::StatusOr<const NcclApi*> nccl = Nccl();
  if (!nccl.ok()) Fail("no NCCL: " + nccl.status().ToString());

  // The chunk: random bytes, as pieces on GPU 0 (each its own allocation, like the paged
  // tier's pages) and as one contiguous copy there for the baselines.
  std::string host(o.chunk, '\0');
  uint64_t rng = 0x5eed;
  for (size_t i = 0; i < host.size(); i += 8) {
    const uint64_t word = SplitMix64(rng);
    std::memcpy(host.data() + i, &word, std::min<size_t>(8, host.size() - i));
  }
  CHECK_CUDA(cudaSetDevice(0));
  std::vector<char*> pieces;
  std::vector<size_t> sizes;
  for (uint64_t offset = 0; offset < o.chunk; offset += o.piece) {
    sizes.push_back(std::min<uint64_t>(o.piece, o.chunk - offset));
    char* piece;
    CHECK_CUDA(cudaMalloc(&piece, sizes.back()));
    CHECK_CUDA(cudaMemcpy(piece, host.data() + offset, sizes.back(), cudaMemcpyHostToDevice));
    pieces.push_back(piece);
  }
  char* contiguous;
  CHECK_CUDA(cudaMalloc(&contiguous, o.chunk));
  CHECK_CUDA(cudaMemcpy(contiguous, host.data(), o.chunk, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaSetDevice(1));
  char *target, *target2;
  CHECK_CUDA(cudaMalloc(&target, o.chunk));
  CHECK_CUDA(cudaMalloc(&target2, o.chunk));

  cudaDeviceProp props[2];
  CHECK_CUDA(cudaGetDeviceProperties(&props[0], 0));
  CHECK_CUDA(cudaGetDeviceProperties(&props[1], 1));
  int can_peer = 0;
  CHECK_CUDA(cudaDeviceCanAccessPeer(&can_peer, 1, 0));

  const Result link = PeerLinkTransfers(o, pieces, sizes, target, host);
  // A chunk in one run of pages (a fresh GPU tier allocates them ascending): one piece.
  const Result link_contiguous = PeerLinkTransfers(o, {contiguous}, {o.chunk}, target, host);
  const Result raw = RawNccl(o, **nccl, contiguous, target);
  const Result raw_nonblocking = RawNccl(o, **nccl, contiguous, target, /*blocking=*/false);
  Result peer{}, local{};
  if (can_peer) {
    EnablePeerAccess(0, 1);
    EnablePeerAccess(1, 0);
  }
  peer = Copies(o, 1, [&](cudaStream_t s) { return cudaMemcpyPeerAsync(target, 1, contiguous, 0, o.chunk, s); });
  local = Copies(
      o, 1, [&](cudaStream_t s) { return cudaMemcpyAsync(target2, target, o.chunk, cudaMemcpyDeviceToDevice, s); });

  std::printf("GPU 0 (%s) -> GPU 1 (%s), peer access %s; NCCL %d (%s), NCCL_NVLS_ENABLE=%s\n", props[0].name,
              props[1].name, can_peer ? "yes" : "NO", (*nccl)->version, (*nccl)->loaded_as.c_str(),
              getenv("NCCL_NVLS_ENABLE"));
  std::printf("%d MiB chunks (peer link: %zu pieces of %d MiB), %d transfers timed after %d warm-up; GB = 1e9 bytes\n",
              chunk_mib, pieces.size(), piece_mib, iterations, warmup);
  std::printf("%-28s %18s %15s\n", "method", "per_transfer_GB/s", "pipelined_GB/s");
  const std::pair<const char*, const Result*> rows[] = {{"peer_link nccl (paged)", &link},
                                                        {"peer_link nccl (one piece)", &link_contiguous},
                                                        {"raw_nccl (contiguous)", &raw},
                                                        {"raw_nccl non-blocking comm", &raw_nonblocking},
                                                        {"memcpy_peer GPU0->GPU1", &peer},
                                                        {"memcpy_d2d on GPU1", &local}};
  for (const auto& [name, r] : rows)
    std::printf("%-28s %18.1f %15.1f\n", name, r->per_transfer_gbps, r->pipelined_gbps);
  auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
  std::printf("%-28s %18.2f %15.2f\n", "peer_link/raw_nccl", ratio(link.per_transfer_gbps, raw.per_transfer_gbps),
              ratio(link.pipelined_gbps, raw.pipelined_gbps));
  std::printf("%-28s %18.2f %15.2f\n", "peer_link/memcpy_peer", ratio(link.per_transfer_gbps, peer.per_transfer_gbps),
              ratio(link.pipelined_gbps, peer.pipelined_gbps));
  std::printf("%-28s %18.2f %15.2f\n", "one_piece/raw_nccl",
              ratio(link_contiguous.per_transfer_gbps, raw.per_transfer_gbps),
              ratio(link_contiguous.pipelined_gbps, raw.pipelined_gbps));
  std::printf("verified: the last peer-link transfer's %llu bytes equal the source\n",
              static_cast<unsigned long long>(o.chunk));

  if (!json_path.empty()) {
    auto row = [](const Result& r) {
      return nlohmann::json{{"per_transfer_gbps", r.per_transfer_gbps}, {"pipelined_gbps", r.pipelined_gbps}};
    };
    nlohmann::json out = {
        {"chunk_bytes", o.chunk},
        {"piece_bytes", o.piece},
        {"pieces", pieces.size()},
        {"iterations", iterations},
        {"warmup", warmup},
        {"gpus", {std::string(props[0].name), std::string(props[1].name)}},
        {"peer_access", can_peer != 0},
        {"nccl_version", (*nccl)->version},
        {"nccl_library", (*nccl)->loaded_as},
        {"methods",
         {{"peer_link", row(link)},
          {"peer_link_one_piece", row(link_contiguous)},
          {"raw_nccl", row(raw)},
          {"raw_nccl_nonblocking", row(raw_nonblocking)},
          {"memcpy_peer", row(peer)},
          {"memcpy_d2d", row(local)}}},
        {"ratios",
         {{"peer_link/raw_nccl",
           {{"per_transfer", ratio(link.per_transfer_gbps, raw.per_transfer_gbps)},
            {"pipelined", ratio(link.pipelined_gbps, raw.pipelined_gbps)}}},
          {"peer_link/memcpy_peer",
           {{"per_transfer", ratio(link.per_transfer_gbps, peer.per_transfer_gbps)},
            {"pipelined", ratio(link.pipelined_gbps, peer.pipelined_gbps)}}}}},
        {"verified", true}};
    std::ofstream file(json_path);
    file << out.dump(2) << "\n";
    if (!file) Fail("cannot write " + json_path);
  }
  for (char* p : pieces) cudaFree(p);
  cudaFree(contiguous);
  cudaFree(target);
  cudaFree(target2);
  return 0;
}

}  // namespace
}  // namespace lazykv

int main(int argc, char** argv) { return lazykv::Main(argc, argv); }
