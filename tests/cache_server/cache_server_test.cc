// lazykv-cache-server as a process on loopback, over gRPC: round trips, batched lookups,
// bad input, limits, tiers (eviction caps, demotion, promotion), persistence across
// kill -9, corruption on disk, leases, health, metrics and graceful shutdown.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <set>
#include <thread>

#include "common/grpc_util.h"
#include "gtest/gtest.h"
#include "proto/grpc/health/v1/health.grpc.pb.h"
#include "tests/cache_server/cache_test_util.h"
#include "tests/test_util.h"

namespace lazykv::testing {
namespace {

using grpc::StatusCode;

class CacheServerTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = TempDir("lazykv_cache_server"); }
  void TearDown() override {
    if (!HasFailure() && std::getenv("LAZYKV_KEEP_TEST_DIRS") == nullptr) std::filesystem::remove_all(dir_);
  }
  std::unique_ptr<ServerProcess> Start(std::vector<std::string> flags = {}) {
    auto server = StartCacheServer(dir_, std::move(flags));
    EXPECT_TRUE(server->started()) << "server printed: " << server->first_line();
    return server;
  }
  std::mt19937_64 rng_{FreshSeed()};
  std::string dir_;
};

TEST_F(CacheServerTest, PutGetRoundTripsAndBatchedLookup) {
  auto server = Start({"--host-capacity", "128MiB", "--disk-capacity", "256MiB"});
  auto stub = CacheStub(server->address());
  // Small, slice-sized and multi-slice chunks (the server sends 4 MiB slices).
  std::vector<TestChunk> chunks;
  for (size_t bytes : {1000ul, 300000ul, 4ul << 20, 9ul << 20 | 4096}) chunks.push_back(RandomTestChunk(rng_, bytes));
  for (const TestChunk& c : chunks) {
    const PutOutcome put = PutChunk(*stub, c);
    ASSERT_TRUE(put.status.ok()) << put.status.error_message();
    EXPECT_FALSE(put.response.already_stored());
    EXPECT_EQ(put.response.stored_bytes(), kChunkHeaderBytes + c.payload.size());
  }
  for (const TestChunk& c : chunks) {
    const GetOutcome got = RawGet(*stub, c.key);
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();
    EXPECT_TRUE(got.stored == c.stored()) << "bytes differ for a chunk of " << c.payload.size();
    EXPECT_EQ(got.tier, v1::TIER_HOST);
  }
  // Putting the same key again changes nothing.
  EXPECT_TRUE(PutChunk(*stub, chunks[1]).response.already_stored());

  v1::LookupRequest lookup;
  std::vector<bool> expected;
  for (int i = 0; i < 40; ++i) {
    const bool present = i % 3 == 0;
    *lookup.add_keys() = ToProto(present ? chunks[i % chunks.size()].key : Hash128{rng_(), rng_()});
    expected.push_back(present);
  }
  v1::LookupResponse found;
  grpc::ClientContext context;
  ASSERT_TRUE(stub->Lookup(&context, lookup, &found).ok());
  ASSERT_EQ(found.results_size(), 40);
  for (int i = 0; i < 40; ++i) {
    EXPECT_EQ(found.results(i).found(), expected[i]) << i;
    if (expected[i]) {
      EXPECT_EQ(found.results(i).stored_bytes(), kChunkHeaderBytes + chunks[i % chunks.size()].payload.size());
    }
  }
  const v1::StatsResponse stats = Stats(*stub);
  EXPECT_EQ(stats.lookups(), 40u);
  EXPECT_EQ(stats.misses(), 40u - 14u);
}

TEST_F(CacheServerTest, BadInputGetsPreciseStatusAndLosesNothing) {
  auto server = Start({"--max-chunk-bytes", "2MiB"});
  auto stub = CacheStub(server->address());
  const TestChunk kept = RandomTestChunk(rng_, 100000);
  ASSERT_TRUE(PutChunk(*stub, kept).status.ok());

  const TestChunk c = RandomTestChunk(rng_, 50000);
  auto expect = [&](const PutOutcome& put, StatusCode code, const std::string& names) {
    EXPECT_EQ(put.status.error_code(), code) << put.status.error_message();
    EXPECT_NE(put.status.error_message().find(names), std::string::npos) << put.status.error_message();
  };
  ChunkHeader future = c.header;
  future.layout_version = kChunkFormatVersion + 1;
  expect(RawPut(*stub, c.key, c.fingerprint, EncodeChunkHeader(future), c.payload), StatusCode::INVALID_ARGUMENT,
         "layout_version");
  expect(RawPut(*stub, c.key, Hash128{rng_(), rng_()}, EncodeChunkHeader(c.header), c.payload),
         StatusCode::INVALID_ARGUMENT, "model_fingerprint");
  expect(RawPut(*stub, Hash128{rng_(), rng_()}, c.fingerprint, EncodeChunkHeader(c.header), c.payload),
         StatusCode::INVALID_ARGUMENT, "header.key");
  expect(RawPut(*stub, c.key, c.fingerprint, EncodeChunkHeader(c.header), c.payload.substr(0, c.payload.size() - 7)),
         StatusCode::INVALID_ARGUMENT, "shorter");
  expect(RawPut(*stub, c.key, c.fingerprint, EncodeChunkHeader(c.header), c.payload + "extra"),
         StatusCode::INVALID_ARGUMENT, "longer");
  std::string flipped = c.payload;
  flipped[flipped.size() / 2] ^= 0x40;
  expect(RawPut(*stub, c.key, c.fingerprint, EncodeChunkHeader(c.header), flipped), StatusCode::DATA_LOSS, "checksum");
  const TestChunk big = RandomTestChunk(rng_, 3 << 20);
  expect(PutChunk(*stub, big), StatusCode::RESOURCE_EXHAUSTED, "max_chunk_bytes");
  const GetOutcome unknown = RawGet(*stub, Hash128{rng_(), rng_()});
  EXPECT_EQ(unknown.status.error_code(), StatusCode::NOT_FOUND);
  v1::LookupRequest too_many;
  for (int i = 0; i < 5000; ++i) *too_many.add_keys() = ToProto(Hash128{rng_(), rng_()});
  v1::LookupResponse ignored;
  grpc::ClientContext context;
  const grpc::Status lookup = stub->Lookup(&context, too_many, &ignored);
  EXPECT_EQ(lookup.error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(lookup.error_message().find("max_lookup_keys"), std::string::npos);

  // None of that stored anything, and what was stored before is intact.
  for (const Hash128& key : {c.key, big.key}) EXPECT_EQ(RawGet(*stub, key).status.error_code(), StatusCode::NOT_FOUND);
  const GetOutcome again = RawGet(*stub, kept.key);
  ASSERT_TRUE(again.status.ok());
  EXPECT_TRUE(again.stored == kept.stored());
  // And the correct upload of the refused chunk still works.
  EXPECT_TRUE(PutChunk(*stub, c).status.ok());
}

TEST_F(CacheServerTest, CapsHoldAndChunksMoveBetweenTiers) {
  const uint64_t host_cap = 4 << 20, disk_cap = 8 << 20;
  auto server = Start({"--host-capacity", "4MiB", "--disk-capacity", "8MiB", "--page-size", "64KiB"});
  auto stub = CacheStub(server->address());
  std::vector<TestChunk> chunks;
  for (int i = 0; i < 24; ++i) {
    chunks.push_back(RandomTestChunk(rng_, 480 << 10));
    ASSERT_TRUE(PutChunk(*stub, chunks.back()).status.ok()) << i;
    const v1::StatsResponse s = Stats(*stub);
    for (const auto& tier : s.tiers()) {
      EXPECT_LE(tier.used_bytes(), tier.tier() == v1::TIER_HOST ? host_cap : disk_cap) << "after put " << i;
    }
  }
  // Let the disk writer finish, then look at where each chunk lives.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  v1::LookupRequest lookup;
  for (const TestChunk& c : chunks) *lookup.add_keys() = ToProto(c.key);
  v1::LookupResponse where;
  grpc::ClientContext context;
  ASSERT_TRUE(stub->Lookup(&context, lookup, &where).ok());
  int host = 0, disk = 0, gone = 0;
  int first_on_disk = -1;
  for (int i = 0; i < where.results_size(); ++i) {
    const auto& r = where.results(i);
    if (!r.found())
      ++gone;
    else if (r.tier() == v1::TIER_HOST)
      ++host;
    else {
      ++disk;
      if (first_on_disk < 0) first_on_disk = i;
    }
  }
  EXPECT_GT(host, 0);
  EXPECT_GT(disk, 0) << "nothing demoted to disk";
  EXPECT_GT(gone, 0) << "24 chunks of ~480 KiB cannot all fit 8 MiB of disk";
  ASSERT_GE(first_on_disk, 0);
  // Reading a demoted chunk serves it from disk and promotes it.
  const GetOutcome from_disk = RawGet(*stub, chunks[first_on_disk].key);
  ASSERT_TRUE(from_disk.status.ok()) << from_disk.status.error_message();
  EXPECT_EQ(from_disk.tier, v1::TIER_DISK);
  EXPECT_TRUE(from_disk.stored == chunks[first_on_disk].stored());
  const GetOutcome promoted = RawGet(*stub, chunks[first_on_disk].key);
  EXPECT_EQ(promoted.tier, v1::TIER_HOST);
  const v1::StatsResponse s = Stats(*stub);
  EXPECT_GT(s.demotions(), 0u);
  EXPECT_EQ(s.promotions(), 1u);
  // The directory itself stays within the cap (DataDirectoryStaysWithinTheDiskCap checks it closely).
  uint64_t dir_bytes = 0;
  for (const auto& f : std::filesystem::recursive_directory_iterator(dir_ + "/db")) {
    if (f.is_regular_file()) dir_bytes += f.file_size();
  }
  EXPECT_LE(dir_bytes, disk_cap) << "disk tier directory grew to " << dir_bytes;
}

TEST_F(CacheServerTest, ChunksSurviveKillMinus9) {
  std::vector<TestChunk> chunks;
  {
    auto server = Start({"--host-capacity", "64MiB", "--disk-capacity", "256MiB"});
    auto stub = CacheStub(server->address());
    for (int i = 0; i < 12; ++i) {
      chunks.push_back(RandomTestChunk(rng_, (1 + rng_() % 2000) << 10));
      ASSERT_TRUE(PutChunk(*stub, chunks.back()).status.ok());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1100));
    EXPECT_EQ(server->Stop(SIGKILL), 128 + SIGKILL);
  }
  auto server = Start({"--host-capacity", "64MiB", "--disk-capacity", "256MiB"});
  auto stub = CacheStub(server->address());
  for (const TestChunk& c : chunks) {
    const GetOutcome got = RawGet(*stub, c.key);
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();
    EXPECT_EQ(got.tier, v1::TIER_DISK);
    EXPECT_TRUE(got.stored == c.stored());
  }
}

// Flips one payload bit of `chunk` in the disk tier's value file (cache_server/disk_tier.h),
// found by its bytes; the server is stopped.
void FlipPayloadBitOnDisk(const std::string& db_dir, const TestChunk& chunk, std::mt19937_64& rng) {
  const std::string path = db_dir + "/values";
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(file.good()) << path;
  const std::string contents((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  const std::string stored = chunk.stored();
  const size_t at = contents.find(stored);
  ASSERT_NE(at, std::string::npos) << "the chunk is not in the value file";
  const size_t flip = at + kChunkHeaderBytes + rng() % chunk.payload.size();
  file.seekp(static_cast<std::streamoff>(flip));
  file.put(static_cast<char>(contents[flip] ^ 0x01));
  ASSERT_TRUE(file.good());
}

TEST_F(CacheServerTest, CorruptValueOnDiskIsReportedCountedAndDropped) {
  const TestChunk victim = RandomTestChunk(rng_, 200000), healthy = RandomTestChunk(rng_, 200000);
  const std::vector<std::string> flags = {"--disk-capacity", "64MiB", "--disk-scrub-rate", "0"};
  {
    auto server = Start(flags);
    auto stub = CacheStub(server->address());
    ASSERT_TRUE(PutChunk(*stub, victim).status.ok());
    ASSERT_TRUE(PutChunk(*stub, healthy).status.ok());
    stub.reset();
    ASSERT_EQ(server->Stop(SIGTERM), 0);
  }
  FlipPayloadBitOnDisk(dir_ + "/db", victim, rng_);
  auto server = Start(flags);
  auto stub = CacheStub(server->address());
  const GetOutcome bad = RawGet(*stub, victim.key);
  EXPECT_EQ(bad.status.error_code(), StatusCode::DATA_LOSS) << bad.status.error_message();
  EXPECT_NE(bad.status.error_message().find("checksum"), std::string::npos) << bad.status.error_message();
  EXPECT_EQ(Stats(*stub).corrupt_values(), 1u);
  EXPECT_EQ(RawGet(*stub, victim.key).status.error_code(), StatusCode::NOT_FOUND) << "a corrupt value was kept";
  const GetOutcome good = RawGet(*stub, healthy.key);
  ASSERT_TRUE(good.status.ok());
  EXPECT_TRUE(good.stored == healthy.stored());
}

// The disk tier's scrub finds a corrupt value with no read asking for it, drops and counts it.
TEST_F(CacheServerTest, ScrubDropsACorruptValueNobodyReads) {
  const TestChunk victim = RandomTestChunk(rng_, 300000), healthy = RandomTestChunk(rng_, 300000);
  {
    auto server = Start({"--disk-capacity", "64MiB"});
    auto stub = CacheStub(server->address());
    ASSERT_TRUE(PutChunk(*stub, victim).status.ok());
    ASSERT_TRUE(PutChunk(*stub, healthy).status.ok());
    stub.reset();
    ASSERT_EQ(server->Stop(SIGTERM), 0);
  }
  FlipPayloadBitOnDisk(dir_ + "/db", victim, rng_);
  auto server = Start({"--disk-capacity", "64MiB", "--disk-scrub-rate", "64MiB"});
  auto stub = CacheStub(server->address());
  for (int i = 0; i < 100 && Stats(*stub).corrupt_values() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(Stats(*stub).corrupt_values(), 1u);
  EXPECT_EQ(RawGet(*stub, victim.key).status.error_code(), StatusCode::NOT_FOUND);
  const GetOutcome good = RawGet(*stub, healthy.key);
  ASSERT_TRUE(good.status.ok());
  EXPECT_TRUE(good.stored == healthy.stored());
}

// Ten times the disk cap put through the real server: its data directory (file sizes and
// allocated blocks, as du -sb and du -s count them) never passes the cap.
TEST_F(CacheServerTest, DataDirectoryStaysWithinTheDiskCap) {
  const uint64_t cap = 16 << 20;
  auto server = Start({"--host-capacity", "4MiB", "--disk-capacity", "16MiB", "--page-size", "64KiB"});
  auto stub = CacheStub(server->address());
  uint64_t put = 0, largest = 0;
  auto measure = [&] {
    uint64_t apparent = 0, allocated = 0;
    std::error_code error;
    for (const auto& f : std::filesystem::recursive_directory_iterator(dir_ + "/db", error)) {
      struct stat st;
      if (lstat(f.path().c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
      apparent += st.st_size;
      allocated += st.st_blocks * 512;
    }
    return std::max(apparent, allocated);
  };
  while (put < 10 * cap) {
    const TestChunk c = RandomTestChunk(rng_, (64 << 10) + rng_() % (1500 << 10));
    ASSERT_TRUE(PutChunk(*stub, c).status.ok());
    put += c.stored().size();
    const uint64_t du = measure();
    largest = std::max(largest, du);
    ASSERT_LE(du, cap) << "after " << put << " bytes put";
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the write-through catches up
  EXPECT_LE(measure(), cap);
  std::printf("directory at most %.3fx the disk cap\n", static_cast<double>(largest) / cap);
  EXPECT_GT(Stats(*stub).tiers_size(), 1);
}

v1::LeaseResponse Lease(v1::KvCache::Stub& stub, const Hash128& key, uint32_t ttl_ms, uint32_t wait_ms) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  v1::LeaseRequest request;
  *request.mutable_key() = ToProto(key);
  request.set_holder("test");
  request.set_ttl_ms(ttl_ms);
  request.set_wait_ms(wait_ms);
  v1::LeaseResponse response;
  EXPECT_TRUE(stub.Lease(&context, request, &response).ok());
  return response;
}

TEST_F(CacheServerTest, LeaseGrantsOnceWakesWaitersOnPublicationAndExpires) {
  auto server = Start();
  auto stub = CacheStub(server->address());
  const TestChunk c = RandomTestChunk(rng_, 100000);
  const v1::LeaseResponse first = Lease(*stub, c.key, 10000, 0);
  EXPECT_EQ(first.outcome(), v1::LeaseResponse::GRANTED);
  EXPECT_EQ(Lease(*stub, c.key, 10000, 0).outcome(), v1::LeaseResponse::HELD);
  // Nobody but the holder publishes under a leased key: without its lease, or with a made-up
  // one, a Put is refused and stores nothing.
  const TestChunk forged = RandomTestChunk(rng_, 100000);
  ChunkHeader forged_header = forged.header;
  forged_header.key = c.key;
  for (uint64_t lease_id : {uint64_t{0}, first.lease_id() + 1}) {
    const PutOutcome squatter =
        RawPut(*stub, c.key, forged.fingerprint, EncodeChunkHeader(forged_header), forged.payload, lease_id);
    EXPECT_EQ(squatter.status.error_code(), StatusCode::PERMISSION_DENIED) << squatter.status.error_message();
    EXPECT_NE(squatter.status.error_message().find("leased to another caller"), std::string::npos);
  }
  EXPECT_EQ(RawGet(*stub, c.key).status.error_code(), StatusCode::NOT_FOUND);
  // A waiter is woken by the publication.
  auto waiter = std::async(std::launch::async, [&] { return Lease(*stub, c.key, 10000, 10000); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ASSERT_TRUE(
      RawPut(*stub, c.key, c.fingerprint, EncodeChunkHeader(c.header), c.payload, first.lease_id()).status.ok());
  EXPECT_EQ(waiter.get().outcome(), v1::LeaseResponse::STORED);
  EXPECT_EQ(Lease(*stub, c.key, 10000, 0).outcome(), v1::LeaseResponse::STORED);

  // A holder that never publishes: its lease expires and a waiter is granted it.
  const TestChunk d = RandomTestChunk(rng_, 1000);
  EXPECT_EQ(Lease(*stub, d.key, 300, 0).outcome(), v1::LeaseResponse::GRANTED);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(Lease(*stub, d.key, 10000, 5000).outcome(), v1::LeaseResponse::GRANTED);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  const v1::StatsResponse s = Stats(*stub);
  EXPECT_EQ(s.lease_grants(), 3u);
  EXPECT_EQ(s.lease_expiries(), 1u);
  EXPECT_EQ(s.lease_waits(), 2u);
}

TEST_F(CacheServerTest, LeaseIdsDoNotRepeatAcrossRestarts) {
  // A lease id from before a restart must not match a lease granted after it.
  std::set<uint64_t> ids;
  for (int run = 0; run < 2; ++run) {
    auto server = Start();
    auto stub = CacheStub(server->address());
    const v1::LeaseResponse lease = Lease(*stub, Hash128{rng_(), rng_()}, 10000, 0);
    ASSERT_EQ(lease.outcome(), v1::LeaseResponse::GRANTED);
    EXPECT_NE(lease.lease_id(), 0u);
    ids.insert(lease.lease_id());
  }
  EXPECT_EQ(ids.size(), 2u);
}

TEST_F(CacheServerTest, StreamLimitRefusesPastItAndKeepsServing) {
  auto server = Start({"--max-streams", "1"});
  auto stub = CacheStub(server->address());
  const TestChunk c = RandomTestChunk(rng_, 1000);
  ASSERT_TRUE(PutChunk(*stub, c).status.ok());
  const Hash128 held{rng_(), rng_()};
  ASSERT_EQ(Lease(*stub, held, 2000, 0).outcome(), v1::LeaseResponse::GRANTED);
  // One lease wait takes the only stream slot...
  auto waiter = std::async(std::launch::async, [&] { return Lease(*stub, held, 2000, 1500); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const GetOutcome refused = RawGet(*stub, c.key);
  EXPECT_EQ(refused.status.error_code(), StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(refused.status.error_message().find("max_concurrent_streams=1"), std::string::npos);
  waiter.get();
  // ...and once it is free, the same call succeeds.
  const GetOutcome ok = RawGet(*stub, c.key);
  ASSERT_TRUE(ok.status.ok());
  EXPECT_TRUE(ok.stored == c.stored());
}

TEST_F(CacheServerTest, StalledStreamsAreCancelledAndFreeTheirSlotAndSpace) {
  // One stream slot and 8 MiB of host RAM. A client opens a Put announcing a 6 MiB chunk,
  // sends its first message and stalls: without a stream idle timeout it would hold the
  // slot and the reserved space for good. The watchdog cancels it, and the same work from
  // a well-behaved client then succeeds; the stalled client's call ends CANCELLED (the
  // server cancelled it).
  auto server = Start({"--max-streams", "1", "--host-capacity", "8MiB", "--disk-capacity", "0", "--metrics-listen",
                       "127.0.0.1:0", "--stream-idle-timeout-ms", std::to_string(300 * SlowdownFactor())});
  auto stub = CacheStub(server->address());
  const TestChunk big = RandomTestChunk(rng_, 6 << 20);
  grpc::ClientContext stalled_context;
  stalled_context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  v1::PutResponse stalled_response;
  auto stalled = stub->Put(&stalled_context, &stalled_response);
  v1::PutRequest first;
  *first.mutable_key() = ToProto(big.key);
  *first.mutable_model_fingerprint() = ToProto(big.fingerprint);
  first.set_header(EncodeChunkHeader(big.header));
  first.set_data(big.payload.substr(0, 4096));
  ASSERT_TRUE(stalled->Write(first));
  std::this_thread::sleep_for(std::chrono::milliseconds(100 * SlowdownFactor()));
  // While it holds the only slot, others are refused...
  const TestChunk small = RandomTestChunk(rng_, 1000);
  EXPECT_EQ(PutChunk(*stub, small).status.error_code(), StatusCode::RESOURCE_EXHAUSTED);
  // ...until the watchdog cancels it (no message for 300 ms).
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10 * SlowdownFactor());
  PutOutcome retried;
  do {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    retried = PutChunk(*stub, small);
  } while (!retried.status.ok() && std::chrono::steady_clock::now() < give_up);
  ASSERT_TRUE(retried.status.ok()) << retried.status.error_message();
  // The space reserved for the stalled chunk is back: a 6 MiB chunk fits again.
  const TestChunk big2 = RandomTestChunk(rng_, 6 << 20);
  const PutOutcome second = PutChunk(*stub, big2);
  EXPECT_TRUE(second.status.ok()) << second.status.error_message();
  const grpc::Status stalled_status = stalled->Finish();
  EXPECT_EQ(stalled_status.error_code(), StatusCode::CANCELLED) << stalled_status.error_message();
  EXPECT_FALSE(RawGet(*stub, big.key).status.ok());  // nothing half-written was stored
  EXPECT_TRUE(RawGet(*stub, small.key).status.ok());
  const std::string page = HttpGet(server->metrics_address(), "/metrics");
  EXPECT_NE(page.find("lazykv_cache_rejected_total{reason=\"stream_idle_timeout\"} 1\n"), std::string::npos) << page;
}

TEST_F(CacheServerTest, HealthMetricsAndGracefulShutdown) {
  // gRPC's shutdown waits on connections that saw a health check; the grace period caps it.
  auto server = Start({"--metrics-listen", "127.0.0.1:0", "--shutdown-grace-ms", "1000"});
  ASSERT_FALSE(server->metrics_address().empty()) << server->first_line();
  auto channel = grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials());
  auto health = grpc::health::v1::Health::NewStub(channel);
  grpc::health::v1::HealthCheckRequest request;
  grpc::health::v1::HealthCheckResponse response;
  grpc::ClientContext context;
  ASSERT_TRUE(health->Check(&context, request, &response).ok());
  EXPECT_EQ(response.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  // Per service as well: the KvCache service by name; an unknown name is NOT_FOUND.
  grpc::ClientContext named_context, unknown_context;
  request.set_service("lazykv.v1.KvCache");
  ASSERT_TRUE(health->Check(&named_context, request, &response).ok());
  EXPECT_EQ(response.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  request.set_service("lazykv.v1.Nothing");
  EXPECT_EQ(health->Check(&unknown_context, request, &response).error_code(), grpc::StatusCode::NOT_FOUND);

  auto stub = CacheStub(server->address());
  const TestChunk c = RandomTestChunk(rng_, 5000);
  ASSERT_TRUE(PutChunk(*stub, c).status.ok());
  v1::LookupRequest lookup;
  *lookup.add_keys() = ToProto(c.key);
  v1::LookupResponse found;
  grpc::ClientContext lookup_context;
  ASSERT_TRUE(stub->Lookup(&lookup_context, lookup, &found).ok());
  const std::string metrics = HttpGet(server->metrics_address(), "/metrics");
  for (const char* name : {"lazykv_cache_lookups_total 1", "lazykv_cache_hits_total{tier=\"host\"} 1",
                           "lazykv_cache_capacity_bytes{tier=\"disk\"}", "lazykv_cache_request_seconds_bucket",
                           "lazykv_cache_lease_grants_total", "lazykv_cache_evictions_total{tier=\"host\"}"}) {
    EXPECT_NE(metrics.find(name), std::string::npos) << name << "\n" << metrics.substr(0, 2000);
  }
  // SIGTERM right after a put: exit 0, and the chunk is on disk for the next start.
  stub.reset();
  health.reset();
  channel.reset();
  EXPECT_EQ(server->Stop(SIGTERM), 0);
  auto again = Start();
  auto stub2 = CacheStub(again->address());
  const GetOutcome got = RawGet(*stub2, c.key);
  ASSERT_TRUE(got.status.ok());
  EXPECT_TRUE(got.stored == c.stored());
}

}  // namespace
}  // namespace lazykv::testing
