// The GPU tier through the real lazykv-cache-server, emulated in host memory (--gpu-emulate)
// so that it runs without a GPU: a chunk published while the tier has room, or read from host
// RAM, is promoted and Lookup then says TIER_GPU; a same-host session learns the tier's geometry, and GpuGet leases the
// chunk's pages with its exact header (the lease counted, and gone with the session);
// Delete drops every copy; a chunk that host RAM evicted (no disk) is still served from the
// GPU tier, and demoted back into host RAM, byte for byte, when the GPU tier evicts it.
// References: the chunks as built (TestChunk), never another read.
#include <grpcpp/grpcpp.h>

#include <filesystem>
#include <random>
#include <thread>

#include "common/grpc_util.h"
#include "gtest/gtest.h"
#include "tests/cache_server/cache_test_util.h"
#include "tests/test_util.h"
#include "worker/tier/remote_chunk_tier.h"

namespace lazykv::testing {
namespace {

using std::chrono::milliseconds;

v1::LookupResult LookupOne(v1::KvCache::Stub& stub, const Hash128& key) {
  grpc::ClientContext context;
  v1::LookupRequest request;
  *request.add_keys() = ToProto(key);
  v1::LookupResponse response;
  EXPECT_TRUE(stub.Lookup(&context, request, &response).ok());
  return response.results_size() == 1 ? response.results(0) : v1::LookupResult();
}

uint64_t GpuEntries(const v1::StatsResponse& stats) {
  for (const v1::TierStats& t : stats.tiers()) {
    if (t.tier() == v1::TIER_GPU) return t.entries();
  }
  return ~0ull;
}

class CacheServerGpuTierTest : public CacheServerTest {
 protected:
  CacheServerGpuTierTest() : CacheServerTest("gpu_tier") {}
  bool Start(std::vector<std::string> flags) {
    flags.insert(flags.end(), {"--gpu-emulate", "--gpu-page-size", "256KiB"});
    return StartServer(std::move(flags));
  }
  // Sends the session's opening request and reads the server's answer.
  using SessionStream = grpc::ClientReaderWriter<v1::ShmSessionRequest, v1::ShmSessionResponse>;
  static bool OpenSession(SessionStream& session, v1::ShmSessionResponse* opened) {
    v1::ShmSessionRequest hello;
    hello.set_holder("gpu-tier-test");
    return session.Write(hello) && session.Read(opened);
  }
};

TEST_F(CacheServerGpuTierTest, AReadChunkIsPromotedAndLeasedThroughGpuGet) {
  SCOPED_TRACE(seed_);
  // The GPU tier holds one of these chunks: a published chunk is promoted while it has room,
  // a read one by evicting.
  ASSERT_TRUE(Start({"--gpu-capacity", "2MiB", "--host-capacity", "32MiB", "--disk-capacity", "0"}));
  const size_t kPayload = std::uniform_int_distribution<size_t>(1100 << 10, 1600 << 10)(rng_);  // 5-7 of its 8 pages
  const TestChunk first = RandomTestChunk(rng_, kPayload), chunk = RandomTestChunk(rng_, kPayload);
  ASSERT_TRUE(PutChunk(*stub_, first).status.ok());
  ASSERT_TRUE(ReachesTier(*stub_, first.key, v1::TIER_GPU)) << "published into free room: promoted";
  ASSERT_TRUE(PutChunk(*stub_, chunk).status.ok());
  std::this_thread::sleep_for(milliseconds(100));
  EXPECT_EQ(LookupOne(*stub_, chunk.key).tier(), v1::TIER_HOST) << "no room and not read yet: not promoted";
  const GetOutcome got = RawGet(*stub_, chunk.key);  // a read promotes it, evicting `first`
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.stored, chunk.stored());
  ASSERT_TRUE(ReachesTier(*stub_, chunk.key, v1::TIER_GPU));
  EXPECT_EQ(LookupOne(*stub_, first.key).tier(), v1::TIER_HOST);
  EXPECT_EQ(GpuEntries(Stats(*stub_)), 1u);

  grpc::ClientContext session_context;
  auto session = stub_->ShmSession(&session_context);
  v1::ShmSessionResponse opened;
  ASSERT_TRUE(OpenSession(*session, &opened));
  EXPECT_EQ(opened.gpu_page_bytes(), 256u << 10);
  EXPECT_EQ(opened.gpu_arena_bytes(), 2u << 20);
  EXPECT_TRUE(opened.gpu_ipc_handle().empty()) << "an emulated tier exports no handle";

  v1::GpuGetResponse leased;
  {
    grpc::ClientContext context;
    v1::GpuGetRequest request;
    request.set_session_id(opened.session_id());
    *request.mutable_key() = ToProto(chunk.key);
    const grpc::Status s = stub_->GpuGet(&context, request, &leased);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  const std::string stored = chunk.stored();
  EXPECT_EQ(leased.header(), stored.substr(0, kChunkHeaderBytes));
  EXPECT_EQ(leased.stored_bytes(), stored.size());
  EXPECT_EQ(static_cast<uint64_t>(leased.pages_size()), (stored.size() + (256 << 10) - 1) / (256 << 10));
  EXPECT_EQ(Stats(*stub_).shm_leases(), 1u);
  {  // Another session's id, or none, leases nothing.
    grpc::ClientContext context;
    v1::GpuGetRequest request;
    request.set_session_id(opened.session_id() + 1);
    *request.mutable_key() = ToProto(chunk.key);
    v1::GpuGetResponse refused;
    EXPECT_EQ(stub_->GpuGet(&context, request, &refused).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  }
  v1::ShmSessionRequest release;
  release.add_release(leased.lease_id());
  ASSERT_TRUE(session->Write(release));
  session->WritesDone();
  EXPECT_TRUE(session->Finish().ok());
  EXPECT_EQ(Stats(*stub_).shm_leases(), 0u);

  {  // Delete drops the GPU copy too; GpuGet then refuses.
    grpc::ClientContext context;
    v1::DeleteRequest request;
    *request.add_keys() = ToProto(chunk.key);
    v1::DeleteResponse response;
    ASSERT_TRUE(stub_->Delete(&context, request, &response).ok());
    EXPECT_EQ(response.deleted(), 1u);
  }
  EXPECT_FALSE(LookupOne(*stub_, chunk.key).found());
  EXPECT_EQ(GpuEntries(Stats(*stub_)), 0u);
}

// ShmGet with prefer_gpu answers from the GPU tier when it holds the chunk (and from host
// RAM otherwise, or without the flag); a worker's tier that asks for the GPU tier but cannot
// open it (emulated: no handle) reads from host RAM, byte for byte.
TEST_F(CacheServerGpuTierTest, ShmGetPrefersTheGpuTierOnlyWhenAskedAndHeld) {
  SCOPED_TRACE(seed_);
  // Room for one of the two chunks: the first published is promoted, the second is not.
  ASSERT_TRUE(Start({"--gpu-capacity", "2MiB", "--host-capacity", "32MiB", "--disk-capacity", "0"}));
  const TestChunk hot = RandomTestChunk(rng_, 1 << 20), cold = RandomTestChunk(rng_, 1 << 20);
  ASSERT_TRUE(PutChunk(*stub_, hot).status.ok());
  ASSERT_TRUE(ReachesTier(*stub_, hot.key, v1::TIER_GPU));
  ASSERT_TRUE(PutChunk(*stub_, cold).status.ok());
  grpc::ClientContext session_context;
  auto session = stub_->ShmSession(&session_context);
  v1::ShmSessionResponse opened;
  ASSERT_TRUE(OpenSession(*session, &opened));
  auto shm_get = [&](const TestChunk& chunk, bool prefer_gpu) {
    grpc::ClientContext context;
    v1::ShmGetRequest request;
    request.set_session_id(opened.session_id());
    *request.mutable_key() = ToProto(chunk.key);
    request.set_prefer_gpu(prefer_gpu);
    v1::ShmGetResponse response;
    EXPECT_TRUE(stub_->ShmGet(&context, request, &response).ok());
    return response;
  };
  const v1::ShmGetResponse from_gpu = shm_get(hot, true);
  EXPECT_EQ(from_gpu.tier(), v1::TIER_GPU);
  EXPECT_EQ(from_gpu.header(), hot.stored().substr(0, kChunkHeaderBytes));
  EXPECT_EQ(from_gpu.stored_bytes(), hot.stored().size());
  const v1::ShmGetResponse not_asked = shm_get(hot, false);
  EXPECT_EQ(not_asked.tier(), v1::TIER_HOST);
  EXPECT_TRUE(not_asked.header().empty());
  const v1::ShmGetResponse not_held = shm_get(cold, true);
  EXPECT_EQ(not_held.tier(), v1::TIER_HOST);
  EXPECT_EQ(Stats(*stub_).shm_leases(), 3u);
  session->WritesDone();
  EXPECT_TRUE(session->Finish().ok());

  RemoteTierOptions options;
  options.servers = {server_->address()};
  options.holder = "gpu-tier-test";
  options.transport = FetchTransport::kShm;
  options.gpu_device = 0;
  auto tier = RemoteChunkTier::Create(options);
  ASSERT_TRUE(tier.ok()) << tier.status();
  for (const TestChunk* chunk : {&hot, &cold}) {
    auto fetched = (*tier)->Fetch(chunk->key);
    ASSERT_TRUE(fetched.ok()) << fetched.status();
    EXPECT_FALSE(fetched->stored.on_device());
    EXPECT_EQ(fetched->stored.ToString(), chunk->stored());
  }
  EXPECT_EQ((*tier)->transport_stats().shm_chunks, 2u);
  EXPECT_EQ((*tier)->transport_stats().cuda_ipc_chunks, 0u);
}

TEST_F(CacheServerGpuTierTest, AChunkOnlyTheGpuHoldsIsServedAndDemotedWhenEvicted) {
  SCOPED_TRACE(seed_);
  // Host RAM holds one 3 MiB chunk, the GPU tier two, no disk.
  ASSERT_TRUE(Start({"--gpu-capacity", "7MiB", "--host-capacity", "4MiB", "--disk-capacity", "0",
                     "--shm-max-lease-bytes-per-session", "4MiB", "--shm-max-lease-bytes", "4MiB"}));
  const size_t kPayload = 3 << 20;
  const TestChunk a = RandomTestChunk(rng_, kPayload), b = RandomTestChunk(rng_, kPayload),
                  c = RandomTestChunk(rng_, kPayload);
  ASSERT_TRUE(PutChunk(*stub_, a).status.ok());
  ASSERT_TRUE(RawGet(*stub_, a.key).status.ok());
  ASSERT_TRUE(ReachesTier(*stub_, a.key, v1::TIER_GPU));
  ASSERT_TRUE(PutChunk(*stub_, b).status.ok());  // host RAM evicts a: the GPU tier holds the only copy
  const GetOutcome only_gpu = RawGet(*stub_, a.key);
  ASSERT_TRUE(only_gpu.status.ok()) << only_gpu.status.error_message();
  EXPECT_EQ(only_gpu.stored, a.stored());
  {  // A same-host reader that cannot take it from the GPU gets it from host RAM, demoted.
    grpc::ClientContext session_context;
    auto session = stub_->ShmSession(&session_context);
    v1::ShmSessionResponse opened;
    ASSERT_TRUE(OpenSession(*session, &opened));
    grpc::ClientContext context;
    v1::ShmGetRequest request;
    request.set_session_id(opened.session_id());
    *request.mutable_key() = ToProto(a.key);
    v1::ShmGetResponse response;
    const grpc::Status s = stub_->ShmGet(&context, request, &response);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(response.tier(), v1::TIER_HOST);
    EXPECT_EQ(response.stored_bytes(), a.stored().size());
    session->WritesDone();
    EXPECT_TRUE(session->Finish().ok());
  }
  // b and c read: promoted. Host RAM holds one chunk and the GPU tier two, so promoting c
  // evicts a or b from the GPU tier while no lower tier holds it: demoted into host RAM,
  // never lost. All three still read back exactly.
  ASSERT_TRUE(RawGet(*stub_, b.key).status.ok());
  ASSERT_TRUE(ReachesTier(*stub_, b.key, v1::TIER_GPU));
  ASSERT_TRUE(PutChunk(*stub_, c).status.ok());
  ASSERT_TRUE(RawGet(*stub_, c.key).status.ok());
  ASSERT_TRUE(ReachesTier(*stub_, c.key, v1::TIER_GPU));
  const bool a_on_gpu = LookupOne(*stub_, a.key).tier() == v1::TIER_GPU;
  const TestChunk& demoted = a_on_gpu ? b : a;
  ASSERT_TRUE(ReachesTier(*stub_, demoted.key, v1::TIER_HOST)) << "the GPU tier's victim was lost, not demoted";
  // Each read promotes what it reads and demotes another; between a victim's eviction and
  // its demotion it is in neither tier for a moment (a miss), so each is polled for.
  for (const TestChunk* chunk : {&a, &b, &c}) {
    GetOutcome back = RawGet(*stub_, chunk->key);
    const auto until = std::chrono::steady_clock::now() + milliseconds(5000) * SlowdownFactor();
    while (!back.status.ok() && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(milliseconds(10));
      back = RawGet(*stub_, chunk->key);
    }
    ASSERT_TRUE(back.status.ok()) << "lost: " << back.status.error_message();
    EXPECT_EQ(back.stored, chunk->stored());
  }
}

}  // namespace
}  // namespace lazykv::testing
