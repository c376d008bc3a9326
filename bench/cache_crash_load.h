// The crash test's load (bench/cache_crash_test.cc): threads that call one cache server over
// real gRPC (Put, Get, Lookup, Delete, Lease then Put) and a Stats poller, recording every
// call in a History and checking each answer that can be checked at once:
// - an OK Get returns exactly StoredChunkOf(key), byte for byte ("get_wrong_bytes",
//   "get_corrupt_chunk", "get_wrong_chunk"); DATA_LOSS is a violation ("get_data_loss"):
//   nothing in this test corrupts stored bytes, so the server must never claim it did;
// - an OK Put, or a Lookup that finds a key, reports the chunk's exact size;
// - a valid chunk is never refused as invalid ("put_refused");
// - every call ends within its deadline plus one second, also when the server is killed
//   under it ("overran_deadline");
// - the server's corrupt_values stays 0.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "bench/cache_crash_model.h"

namespace lazykv::crash {

struct LoadOptions {
  uint64_t seed = 1;
  int threads = 4;
  double ops_per_second = 400;  // all threads together
  double put_mbps = 16;         // bytes put per second, all threads together (MB/s)
  int put_deadline_ms = 5000, get_deadline_ms = 5000, small_deadline_ms = 2000;
};

// What the Stats poller saw of one server process.
struct ServerObservations {
  std::atomic<uint64_t> max_pending_disk_writes{0};
  std::atomic<uint64_t> disk_evictions{0}, host_evictions{0}, demotions{0}, promotions{0};
};

// Runs the load against one server process (`incarnation`) until Stop. Thread-safe: Stop may
// be called from any thread.
class Load {
 public:
  Load(const LoadOptions& options, int incarnation, const std::string& address, std::atomic<int64_t>* next_id,
       History* history, ServerObservations* observed);
  ~Load();  // stops and joins
  void Stop();

 private:
  void Run(int thread_index);
  void PollStats();

  const LoadOptions options_;
  const int incarnation_;
  const std::string address_;
  std::atomic<int64_t>* next_id_;
  History* history_;
  ServerObservations* observed_;
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
};

}  // namespace lazykv::crash
