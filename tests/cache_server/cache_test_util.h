// Shared by the cache tier's integration tests: random chunks, a server on loopback,
// and raw KvCache calls that expose the exact gRPC status.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/child_process.h"
#include "gtest/gtest.h"
#include "common/chunk_codec.h"
#include "proto/kvcache.grpc.pb.h"

namespace lazykv::testing {

using lazykv::HttpGet;
using lazykv::ServerProcess;

struct TestChunk {
  Hash128 key, fingerprint;
  ChunkHeader header;
  std::string payload;
  std::string stored() const { return EncodeChunk(header, payload); }
};

// A chunk of about `payload_bytes` (rounded to whole tokens) with random contents.
TestChunk RandomTestChunk(std::mt19937_64& rng, size_t payload_bytes);

std::string TempDir(const std::string& name);  // fresh, under the system temp dir

// lazykv-cache-server on 127.0.0.1:0 with `data_dir` and extra flags.
std::unique_ptr<ServerProcess> StartCacheServer(const std::string& data_dir, std::vector<std::string> flags = {});

std::unique_ptr<v1::KvCache::Stub> CacheStub(const std::string& address);

struct PutOutcome {
  grpc::Status status;
  v1::PutResponse response;
};
// Streams header then payload in `slice`-byte messages.
PutOutcome RawPut(v1::KvCache::Stub& stub, const Hash128& key, const Hash128& fingerprint, const std::string& header,
                  const std::string& payload, uint64_t lease_id = 0, size_t slice = 1 << 20);
PutOutcome PutChunk(v1::KvCache::Stub& stub, const TestChunk& chunk);

struct GetOutcome {
  grpc::Status status;
  std::string stored;  // header + payload
  v1::Tier tier = v1::TIER_UNSPECIFIED;
};
GetOutcome RawGet(v1::KvCache::Stub& stub, const Hash128& key);

v1::StatsResponse Stats(v1::KvCache::Stub& stub);
// Polls Lookup until the server reports `key` in `tier` (true) or `limit` passes (scaled
// under sanitizers).
bool ReachesTier(v1::KvCache::Stub& stub, const Hash128& key, v1::Tier tier,
                 std::chrono::milliseconds limit = std::chrono::milliseconds(5000));

// A test with a lazykv-cache-server of its own: a fresh seed (for the test's SCOPED_TRACE),
// a temporary data directory named after `name` and removed at the end, and StartServer.
class CacheServerTest : public ::testing::Test {
 protected:
  explicit CacheServerTest(std::string name) : name_(std::move(name)) {}
  void SetUp() override;     // the seed and the directory
  void TearDown() override;  // stops the server, removes the directory
  // Starts the server on the directory with `flags` and connects stub_; false (with a test
  // failure recorded) when it did not start.
  bool StartServer(std::vector<std::string> flags);

  uint64_t seed_ = 0;
  std::mt19937_64 rng_;
  std::string dir_;
  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<v1::KvCache::Stub> stub_;

 private:
  const std::string name_;
};

// The value of one series (`name{labels}` exactly as exported) in a Prometheus text page;
// -1 when absent.
double Metric(const std::string& page, const std::string& series);

}  // namespace lazykv::testing
