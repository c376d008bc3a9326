// A lookup's leases on the same-host transport (issue 17), against the real
// lazykv-cache-server: a lookup from a worker with a same-host session leases what the
// server holds in host RAM, so that the fetch after it makes no call (proven by freezing
// the server: the fetches still succeed, byte for byte equal to the chunks as built); the
// leases a worker does not use go back (NotFetching, or past their hold, also when the
// worker is idle), and none is left on the server; the lookup's leases take at most half of the session's bound, so
// fetches past them still find room over shared memory; a chunk deleted under a lookup's
// lease keeps its bytes until the fetch is done with them. Skips where the server has no
// shared memory.
#include <signal.h>

#include <random>
#include <thread>

#include "common/grpc_util.h"
#include "gtest/gtest.h"
#include "tests/cache_server/cache_test_util.h"
#include "tests/test_util.h"
#include "worker/tier/remote_chunk_tier.h"
#include "worker/tier/shm_session.h"

namespace lazykv::testing {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

class LookupLeaseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = FreshSeed();
    rng_.seed(seed_);
    dir_ = TempDir("lookup_lease");
  }
  void TearDown() override {
    if (frozen_) server_->Signal(SIGCONT);
    server_.reset();
    std::filesystem::remove_all(dir_);
  }
  // A server with `flags`; false (the test then skips) when its arena is not shared.
  bool Start(std::vector<std::string> flags) {
    flags.insert(flags.begin(), {"--disk-capacity", "0", "--host-capacity", "64MiB"});
    server_ = StartCacheServer(dir_, flags);
    EXPECT_TRUE(server_->started()) << server_->first_line();
    stub_ = CacheStub(server_->address());
    return server_->started() && Stats(*stub_).shm_arena_bytes() != 0;
  }
  std::unique_ptr<RemoteChunkTier> MakeTier(milliseconds hold = milliseconds(60000)) {
    RemoteTierOptions options;
    options.servers = {server_->address()};
    options.holder = "lookup-lease-test";
    options.initial_call_deadline = milliseconds(500 * SlowdownFactor());
    options.lookup_lease_hold = hold;
    auto tier = RemoteChunkTier::Create(options);
    EXPECT_TRUE(tier.ok()) << tier.status();
    return *std::move(tier);
  }
  std::vector<TestChunk> PutChunks(int n) {
    std::vector<TestChunk> chunks;
    // At most 1 MiB each: six fit half of the session's byte bound (a quarter of 64 MiB).
    std::uniform_int_distribution<size_t> size(1, 1 << 20);
    for (int i = 0; i < n; ++i) {
      chunks.push_back(RandomTestChunk(rng_, size(rng_)));
      EXPECT_TRUE(PutChunk(*stub_, chunks.back()).status.ok());
    }
    return chunks;
  }
  static std::vector<Hash128> Keys(const std::vector<TestChunk>& chunks) {
    std::vector<Hash128> keys;
    for (const TestChunk& chunk : chunks) keys.push_back(chunk.key);
    return keys;
  }
  // Polls the server's lease count until it is `leases` (true) or 5 s pass.
  bool LeasesReach(uint64_t leases) {
    const auto until = Clock::now() + milliseconds(5000) * SlowdownFactor();
    while (Clock::now() < until) {
      if (Stats(*stub_).shm_leases() == leases) return true;
      std::this_thread::sleep_for(milliseconds(20));
    }
    return Stats(*stub_).shm_leases() == leases;
  }

  uint64_t seed_ = 0;
  std::mt19937_64 rng_;
  std::string dir_;
  std::unique_ptr<ServerProcess> server_;
  bool frozen_ = false;  // stopped by SIGSTOP: resumed before it is stopped for good
  std::unique_ptr<v1::KvCache::Stub> stub_;
};

#define START_OR_SKIP(...)                   \
  if (!Start(__VA_ARGS__)) {                 \
    if (HasFailure()) return;                \
    GTEST_SKIP() << "no shared memory here"; \
  }

TEST_F(LookupLeaseTest, FetchesAfterALookupMakeNoCallAndAreByteExact) {
  SCOPED_TRACE(seed_);
  START_OR_SKIP({});
  const std::vector<TestChunk> chunks = PutChunks(6);
  auto tier = MakeTier();
  const std::vector<std::optional<TierHit>> hits = tier->Lookup(Keys(chunks));
  ASSERT_EQ(hits.size(), chunks.size());
  for (const auto& hit : hits) ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(Stats(*stub_).shm_leases(), chunks.size()) << "the lookup leased every chunk it found in host RAM";

  // A frozen server answers no call: what is fetched now comes from the lookup's leases.
  server_->Signal(SIGSTOP);
  frozen_ = true;
  std::vector<FetchedChunk> held;
  for (const TestChunk& chunk : chunks) {
    const auto start = Clock::now();
    auto fetched = tier->Fetch(chunk.key);
    ASSERT_TRUE(fetched.ok()) << fetched.status();
    EXPECT_LT(Clock::now() - start, milliseconds(200) * SlowdownFactor()) << "a fetch waited on the frozen server";
    EXPECT_EQ(fetched->stored.ToString(), chunk.stored());
    EXPECT_TRUE(fetched->payload_verified);
    held.push_back(*std::move(fetched));
  }
  server_->Signal(SIGCONT);
  frozen_ = false;
  const TransportStats t = tier->transport_stats();
  EXPECT_EQ(t.lookup_leases_used, chunks.size());
  EXPECT_EQ(t.lookup_leases_unused, 0u);
  EXPECT_EQ(t.shm_chunks, chunks.size());
  EXPECT_EQ(t.grpc_chunks, 0u);

  // A second fetch of a chunk has no lease left from the lookup: it asks (ShmGet).
  auto again = tier->Fetch(chunks[0].key);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->stored.ToString(), chunks[0].stored());
  EXPECT_EQ(tier->transport_stats().lookup_leases_used, chunks.size());
  held.clear();
  again = absl::UnknownError("dropped");
  EXPECT_TRUE(LeasesReach(0)) << "every lease goes back when its bytes go";
}

TEST_F(LookupLeaseTest, AChunkInTheGpuTierIsLeasedFromHostRamToAWorkerWithoutTheTier) {
  SCOPED_TRACE(seed_);
  // The GPU tier emulated in host memory: this worker cannot open it (no CUDA IPC handle) and
  // has no peer link, so the lookup leases the chunks' host RAM copies.
  START_OR_SKIP({"--gpu-capacity", "32MiB", "--gpu-emulate"});
  const std::vector<TestChunk> chunks = PutChunks(3);
  auto tier = MakeTier();
  ASSERT_TRUE(Eventually([&] {
    size_t on_gpu = 0;
    for (const auto& hit : tier->Lookup(Keys(chunks))) on_gpu += hit && hit->server_tier == "gpu" ? 1 : 0;
    return on_gpu == chunks.size();
  })) << "published chunks are promoted while the GPU tier has room";
  server_->Signal(SIGSTOP);
  frozen_ = true;
  for (const TestChunk& chunk : chunks) {
    auto fetched = tier->Fetch(chunk.key);
    ASSERT_TRUE(fetched.ok()) << fetched.status();
    EXPECT_EQ(fetched->stored.ToString(), chunk.stored());
    EXPECT_FALSE(fetched->stored.on_device());
  }
  server_->Signal(SIGCONT);
  frozen_ = false;
  EXPECT_EQ(tier->transport_stats().lookup_leases_used, chunks.size());
  EXPECT_EQ(tier->transport_stats().shm_chunks, chunks.size());
}

TEST_F(LookupLeaseTest, LeasesNotFetchedGoBack) {
  SCOPED_TRACE(seed_);
  START_OR_SKIP({});
  const std::vector<TestChunk> chunks = PutChunks(4);
  {
    auto tier = MakeTier();
    tier->Lookup(Keys(chunks));
    ASSERT_EQ(Stats(*stub_).shm_leases(), chunks.size());
    for (const TestChunk& chunk : chunks) tier->NotFetching(chunk.key);
    EXPECT_TRUE(LeasesReach(0)) << "NotFetching releases the lookup's lease";
    EXPECT_EQ(tier->transport_stats().lookup_leases_unused, chunks.size());
    // Two lookups of one chunk (two requests): NotFetching drops one lease, the fetch takes the other.
    const std::vector<Hash128> one = {chunks[1].key};
    tier->Lookup(one);
    tier->Lookup(one);
    ASSERT_EQ(Stats(*stub_).shm_leases(), 2u);
    tier->NotFetching(chunks[1].key);
    EXPECT_TRUE(LeasesReach(1));
    auto fetched = tier->Fetch(chunks[1].key);
    ASSERT_TRUE(fetched.ok()) << fetched.status();
    EXPECT_EQ(fetched->stored.ToString(), chunks[1].stored());
    EXPECT_EQ(tier->transport_stats().lookup_leases_used, 1u);
  }
  EXPECT_TRUE(LeasesReach(0)) << "the tier's end releases what it held";

  // Held past their time: the next lookup drops them, and a fetch does not take one.
  auto tier = MakeTier(milliseconds(100));
  tier->Lookup(Keys(chunks));
  ASSERT_EQ(Stats(*stub_).shm_leases(), chunks.size());
  std::this_thread::sleep_for(milliseconds(150));
  auto fetched = tier->Fetch(chunks[0].key);  // a stale lease is not used: asked afresh
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_EQ(fetched->stored.ToString(), chunks[0].stored());
  EXPECT_EQ(tier->transport_stats().lookup_leases_used, 0u);
  tier->Lookup(std::vector<Hash128>{});  // sweeps nothing: no server asked
  tier->Lookup(std::vector<Hash128>{chunks[3].key});
  EXPECT_TRUE(LeasesReach(2)) << "chunk 0's fetch and chunk 3's fresh lookup hold one each";
  EXPECT_EQ(tier->transport_stats().lookup_leases_unused, chunks.size());
}

TEST_F(LookupLeaseTest, ATierThatGoesReleasesItsLookupLeasesFirst) {
  SCOPED_TRACE(seed_);
  START_OR_SKIP({});
  const std::vector<TestChunk> chunks = PutChunks(4);
  for (int i = 0; i < 3; ++i) {
    auto tier = MakeTier();
    tier->Lookup(Keys(chunks));
    ASSERT_EQ(Stats(*stub_).shm_leases(), chunks.size());
    tier.reset();  // its session sends the releases before it closes: nothing is orphaned
    EXPECT_TRUE(LeasesReach(0)) << "round " << i;
  }
}

TEST_F(LookupLeaseTest, ALookupWhoseAnswerIsLostHasItsLeasesReleasedByItsId) {
  SCOPED_TRACE(seed_);
  START_OR_SKIP({});
  const std::vector<TestChunk> chunks = PutChunks(3);
  auto session = ShmClientSession::Open(grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()),
                                        "lookup-lease-test", std::chrono::seconds(5) * SlowdownFactor());
  ASSERT_TRUE(session.ok()) << session.status();
  // Two lookups leasing under their ids; the worker "lost" the first answer.
  for (uint64_t lookup_id : {101u, 102u}) {
    grpc::ClientContext context;
    v1::LookupRequest request;
    for (const TestChunk& chunk : chunks) *request.add_keys() = ToProto(chunk.key);
    request.set_shm_session_id((*session)->id());
    request.set_lookup_id(lookup_id);
    v1::LookupResponse response;
    ASSERT_TRUE(stub_->Lookup(&context, request, &response).ok());
    for (const v1::LookupResult& r : response.results()) EXPECT_NE(r.lease().lease_id(), 0u);
  }
  ASSERT_EQ(Stats(*stub_).shm_leases(), 2 * chunks.size());
  (*session)->ReleaseLookup(999);  // unknown: nothing
  (*session)->ReleaseLookup(101);
  EXPECT_TRUE(LeasesReach(chunks.size())) << "the first lookup's leases, and only those, go";
  (*session)->ReleaseLookup(102);
  EXPECT_TRUE(LeasesReach(0));
}

// The worker's own path: a lookup that times out on a frozen server gets no answer; once the
// server resumes, whatever it leased for that lookup goes back (the server's cancellation
// check, or the worker's release by the lookup's id), and the worker finds the chunks again.
TEST_F(LookupLeaseTest, ALookupThatTimesOutLeavesNoLeaseBehind) {
  SCOPED_TRACE(seed_);
  START_OR_SKIP({});
  const std::vector<TestChunk> chunks = PutChunks(3);
  RemoteTierOptions options;
  options.servers = {server_->address()};
  options.holder = "lookup-lease-test";
  options.initial_call_deadline = milliseconds(500 * SlowdownFactor());
  options.min_call_deadline = milliseconds(20);
  options.probe_interval = milliseconds(20);
  options.lookup_lease_hold = milliseconds(100);
  auto tier = RemoteChunkTier::Create(options);
  ASSERT_TRUE(tier.ok()) << tier.status();
  for (int i = 0; i < 3; ++i) (*tier)->Lookup(Keys(chunks));  // its call deadline learns the loopback's latency
  ASSERT_TRUE(LeasesReach(0)) << "held past 100 ms: swept";
  server_->Signal(SIGSTOP);
  frozen_ = true;
  for (const auto& hit : (*tier)->Lookup(Keys(chunks))) EXPECT_FALSE(hit.has_value()) << "no answer: misses";
  server_->Signal(SIGCONT);
  frozen_ = false;
  EXPECT_TRUE(LeasesReach(0)) << "the timed-out lookup's leases";
  EXPECT_TRUE(Eventually([&] {
    const auto hits = (*tier)->Lookup(Keys(chunks));
    return std::all_of(hits.begin(), hits.end(), [](const auto& hit) { return hit.has_value(); });
  })) << "the server comes back up for this worker";
}

TEST_F(LookupLeaseTest, AnIdleWorkersLookupLeasesGoBackByThemselves) {
  SCOPED_TRACE(seed_);
  START_OR_SKIP({});
  const std::vector<TestChunk> chunks = PutChunks(3);
  auto tier = MakeTier(milliseconds(100));
  tier->Lookup(Keys(chunks));
  ASSERT_EQ(Stats(*stub_).shm_leases(), chunks.size());
  // No call of this worker's after the lookup: its own thread drops them.
  EXPECT_TRUE(LeasesReach(0));
  EXPECT_EQ(tier->transport_stats().lookup_leases_unused, chunks.size());
}

TEST_F(LookupLeaseTest, ALookupTakesAtMostHalfTheSessionsBound) {
  SCOPED_TRACE(seed_);
  START_OR_SKIP({"--shm-max-leases", "4"});
  const std::vector<TestChunk> chunks = PutChunks(6);
  auto tier = MakeTier();
  const std::vector<std::optional<TierHit>> hits = tier->Lookup(Keys(chunks));
  for (const auto& hit : hits) EXPECT_TRUE(hit.has_value()) << "found, leased or not";
  EXPECT_EQ(Stats(*stub_).shm_leases(), 2u) << "half of --shm-max-leases";
  // Every chunk still comes over shared memory: two from the lookup, two asked (the
  // bound's other half), and after those are dropped the last two.
  std::vector<FetchedChunk> held;
  for (int i = 0; i < 4; ++i) {
    auto fetched = tier->Fetch(chunks[i].key);
    ASSERT_TRUE(fetched.ok()) << fetched.status();
    EXPECT_EQ(fetched->stored.ToString(), chunks[i].stored());
    held.push_back(*std::move(fetched));
  }
  held.clear();
  ASSERT_TRUE(LeasesReach(0)) << "releases are sent by the session's thread";
  for (int i = 4; i < 6; ++i) {
    auto fetched = tier->Fetch(chunks[i].key);
    ASSERT_TRUE(fetched.ok()) << fetched.status();
    EXPECT_EQ(fetched->stored.ToString(), chunks[i].stored());
  }
  const TransportStats t = tier->transport_stats();
  EXPECT_EQ(t.lookup_leases_used, 2u);
  EXPECT_EQ(t.shm_chunks, 6u);
  EXPECT_EQ(t.grpc_chunks, 0u);
}

TEST_F(LookupLeaseTest, AChunkDeletedUnderALookupsLeaseKeepsItsBytes) {
  SCOPED_TRACE(seed_);
  START_OR_SKIP({});
  const std::vector<TestChunk> chunks = PutChunks(3);
  auto tier = MakeTier();
  tier->Lookup(Keys(chunks));
  {
    grpc::ClientContext context;
    v1::DeleteRequest request;
    for (const TestChunk& chunk : chunks) *request.add_keys() = ToProto(chunk.key);
    v1::DeleteResponse response;
    ASSERT_TRUE(stub_->Delete(&context, request, &response).ok());
    ASSERT_EQ(response.deleted(), chunks.size());
  }
  // The freed index entries' pages are not reused while leased: fresh chunks land elsewhere.
  const std::vector<TestChunk> fresh = PutChunks(6);
  for (const TestChunk& chunk : chunks) {
    auto fetched = tier->Fetch(chunk.key);
    ASSERT_TRUE(fetched.ok()) << fetched.status();
    EXPECT_EQ(fetched->stored.ToString(), chunk.stored());
  }
  EXPECT_EQ(tier->transport_stats().lookup_leases_used, chunks.size());
  EXPECT_FALSE(tier->Fetch(chunks[0].key).ok()) << "deleted: nothing to fetch once the lease is used";
}

}  // namespace
}  // namespace lazykv::testing
