// Chunks across GPUs through the real lazykv-cache-server, with its GPU tier emulated in
// host memory (--gpu-emulate) and the NCCL link's socket twin, so that it runs without a GPU:
// a worker's tier forced to the link (--transport nccl) fetches a chunk of the GPU tier over
// it byte for byte, and one the GPU tier does not hold another way; bad sessions and calls
// are refused by name; a worker that goes before receiving what it asked for leaves no
// session and no transfer behind, and the next worker is served. References: the chunks as
// built (TestChunk), never another read.
#include <grpcpp/grpcpp.h>

#include <filesystem>
#include <random>
#include <thread>

#include "common/grpc_util.h"
#include "common/peer_link/peer_link.h"
#include "gtest/gtest.h"
#include "tests/cache_server/cache_test_util.h"
#include "tests/test_util.h"
#include "worker/tier/remote_chunk_tier.h"

namespace lazykv::testing {
namespace {

using std::chrono::milliseconds;

class CacheServerPeerLinkTest : public CacheServerTest {
 protected:
  CacheServerPeerLinkTest() : CacheServerTest("peer_link") {}
  void SetUp() override {
    CacheServerTest::SetUp();
    ASSERT_TRUE(StartServer({"--gpu-emulate", "--gpu-capacity", "8MiB", "--gpu-page-size", "256KiB", "--host-capacity",
                             "64MiB", "--disk-capacity", "0"}));
  }
  std::unique_ptr<RemoteChunkTier> LinkClient() {
    RemoteTierOptions options;
    options.servers = {server_->address()};
    options.holder = "peer-link-test";
    options.initial_call_deadline = milliseconds(2000);
    options.transport = FetchTransport::kNccl;
    options.peer_link_kind = "socket";
    options.peer_links_per_server = 2;
    options.peer_first_buffer_bytes = 1 << 20;  // smaller than some chunks: asked again with a larger one
    auto tier = RemoteChunkTier::Create(options);
    EXPECT_TRUE(tier.ok()) << tier.status();
    return *std::move(tier);
  }
  // A chunk published while the GPU tier has room for it: promoted there.
  TestChunk OnGpu(size_t payload) {
    TestChunk chunk = RandomTestChunk(rng_, payload);
    EXPECT_TRUE(PutChunk(*stub_, chunk).status.ok());
    EXPECT_TRUE(ReachesTier(*stub_, chunk.key, v1::TIER_GPU));
    return chunk;
  }
};

TEST_F(CacheServerPeerLinkTest, GpuTierChunksComeOverTheLinkExactly) {
  SCOPED_TRACE(seed_);
  std::vector<TestChunk> chunks;
  uint64_t payload_bytes = 0;
  for (int i = 0; i < 3; ++i) {
    // The last larger than the link's first receive buffer (2 MiB, rounded up from 1).
    chunks.push_back(OnGpu(i < 2 ? std::uniform_int_distribution<size_t>(300 << 10, 1 << 20)(rng_) : 3 << 20));
    payload_bytes += chunks.back().payload.size();
  }
  // Larger than the whole GPU tier: host RAM only.
  const TestChunk host_only = RandomTestChunk(rng_, 9 << 20);
  ASSERT_TRUE(PutChunk(*stub_, host_only).status.ok());

  std::unique_ptr<RemoteChunkTier> tier = LinkClient();
  ASSERT_TRUE(Eventually([&] { return tier->transport_stats().peer_sessions == 2; })) << "both links come up";
  EXPECT_EQ(Stats(*stub_).peer_sessions(), 2u);
  for (const TestChunk& chunk : chunks) {
    auto fetched = tier->Fetch(chunk.key);
    ASSERT_TRUE(fetched.ok()) << fetched.status();
    EXPECT_EQ(fetched->stored.ToString(), chunk.stored());
    EXPECT_TRUE(fetched->payload_verified);
    EXPECT_FALSE(fetched->stored.on_device()) << "the socket twin receives into host memory";
  }
  // Fetches from several threads at once share the two links, each link's in order.
  std::vector<std::thread> threads;
  std::atomic<int> exact{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (const TestChunk& chunk : chunks) {
        auto again = tier->Fetch(chunk.key);
        if (again.ok() && again->stored.ToString() == chunk.stored()) exact.fetch_add(1);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(exact.load(), 4 * static_cast<int>(chunks.size()));
  TransportStats stats = tier->transport_stats();
  EXPECT_EQ(stats.nccl_chunks, 5 * chunks.size());
  EXPECT_EQ(stats.nccl_bytes, 5 * (payload_bytes + chunks.size() * kChunkHeaderBytes));
  // Not in the GPU tier: served another way, and the link lives on.
  auto fetched = tier->Fetch(host_only.key);
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_EQ(fetched->stored.ToString(), host_only.stored());
  stats = tier->transport_stats();
  EXPECT_EQ(stats.nccl_chunks, 5 * chunks.size());
  EXPECT_EQ(stats.shm_chunks + stats.grpc_chunks, 1u);
  EXPECT_EQ(stats.peer_sessions, 2u);
  // The server counted each payload once the worker had it.
  EXPECT_TRUE(Eventually([&] { return Stats(*stub_).peer_bytes_sent() == 5 * payload_bytes; }))
      << Stats(*stub_).peer_bytes_sent() << " of " << 5 * payload_bytes;
  EXPECT_EQ(Stats(*stub_).peer_transfers_failed(), 0u);
  tier.reset();
  EXPECT_TRUE(Eventually([&] { return Stats(*stub_).peer_sessions() == 0; })) << "the session ends with the worker";
}

TEST_F(CacheServerPeerLinkTest, BadSessionsAndCallsAreRefusedByName) {
  const TestChunk chunk = OnGpu(100 << 10);
  auto open = [&](const std::string& kind, v1::PeerLinkSessionResponse* answer) {
    grpc::ClientContext context;
    auto stream = stub_->PeerLinkSession(&context);
    v1::PeerLinkSessionRequest request;
    request.set_holder("peer-link-test");
    request.set_kind(kind);
    EXPECT_TRUE(stream->Write(request));
    stream->WritesDone();
    while (stream->Read(answer)) {
    }
    return stream->Finish();
  };
  v1::PeerLinkSessionResponse answer;
  grpc::Status status = open("nccl", &answer);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(status.error_message().find("emulated"), std::string::npos) << status.error_message();
  status = open("", &answer);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("kind"), std::string::npos) << status.error_message();
  status = open("pigeon", &answer);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  {
    grpc::ClientContext context;
    v1::PeerGetRequest request;
    request.set_session_id(12345);
    *request.mutable_key() = ToProto(chunk.key);
    v1::PeerGetResponse response;
    status = stub_->PeerGet(&context, request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << "an unknown session";
  }
  for (const bool with_session : {false, true}) {  // each missing field named
    grpc::ClientContext context;
    v1::PeerGetRequest request;
    if (with_session) request.set_session_id(12345);
    v1::PeerGetResponse response;
    status = stub_->PeerGet(&context, request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(status.error_message().find(with_session ? "key" : "session_id"), std::string::npos)
        << status.error_message();
  }
  EXPECT_EQ(Stats(*stub_).peer_sessions(), 0u);
  // A server without a GPU tier has no links to offer.
  const std::string other_dir = TempDir("peer_link_none");
  std::unique_ptr<ServerProcess> plain = StartCacheServer(other_dir, {"--disk-capacity", "0"});
  ASSERT_TRUE(plain->started());
  std::unique_ptr<v1::KvCache::Stub> plain_stub = CacheStub(plain->address());
  grpc::ClientContext context;
  auto stream = plain_stub->PeerLinkSession(&context);
  v1::PeerLinkSessionRequest request;
  request.set_kind("socket");
  stream->Write(request);
  stream->WritesDone();
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  plain.reset();
  std::filesystem::remove_all(other_dir);
}

TEST_F(CacheServerPeerLinkTest, AWorkerThatGoesBeforeReceivingLeavesNothingBehind) {
  SCOPED_TRACE(seed_);
  // Larger than the socket's buffers, so the transfer cannot finish until it is received.
  const TestChunk chunk = OnGpu(6 << 20);
  // The worker's end of the link stays open throughout: only the server's abort (its
  // session's stream ended) can end the transfer before its 10 s deadline.
  std::unique_ptr<PeerLink> worker_end;
  {
    grpc::ClientContext context;
    auto stream = stub_->PeerLinkSession(&context);
    v1::PeerLinkSessionRequest request;
    request.set_holder("goes-away");
    request.set_kind("socket");
    ASSERT_TRUE(stream->Write(request));
    v1::PeerLinkSessionResponse answer;
    ASSERT_TRUE(stream->Read(&answer));
    auto link = ConnectPeerLink(PeerLinkOptions{.kind = "socket", .device = -1, .cancel = nullptr}, answer.link_id(), 1,
                                PeerLinkClock::now() + milliseconds(5000));
    ASSERT_TRUE(link.ok()) << link.status();
    worker_end = *std::move(link);
    v1::PeerGetRequest get;
    get.set_session_id(answer.session_id());
    *get.mutable_key() = ToProto(chunk.key);
    v1::PeerGetResponse got;
    {  // A receive buffer too small: nothing sent, and the size told.
      grpc::ClientContext small_context;
      get.set_max_payload_bytes(chunk.payload.size() - 1);
      ASSERT_TRUE(stub_->PeerGet(&small_context, get, &got).ok());
      EXPECT_FALSE(got.found());
      EXPECT_EQ(got.stored_bytes(), chunk.stored().size());
      get.set_max_payload_bytes(chunk.payload.size());
    }
    grpc::ClientContext get_context;
    ASSERT_TRUE(stub_->PeerGet(&get_context, get, &got).ok());
    ASSERT_TRUE(got.found());
    EXPECT_EQ(got.header(), chunk.stored().substr(0, kChunkHeaderBytes));
    uint64_t sum = 0;
    for (uint64_t s : got.segments()) sum += s;
    EXPECT_EQ(sum, chunk.payload.size());
    EXPECT_EQ(Stats(*stub_).peer_sessions(), 1u);
    context.TryCancel();  // the worker goes without receiving (its process is killed)
    (void)stream->Finish();
  }
  EXPECT_TRUE(Eventually([&] { return Stats(*stub_).peer_sessions() == 0; }));
  EXPECT_TRUE(Eventually([&] { return Stats(*stub_).peer_transfers_failed() == 1; }, milliseconds(3000)))
      << "the queued transfer did not end with the link";
  EXPECT_EQ(Stats(*stub_).peer_bytes_sent(), 0u);
  worker_end.reset();
  // The next worker is served, byte for byte.
  std::unique_ptr<RemoteChunkTier> tier = LinkClient();
  ASSERT_TRUE(Eventually([&] { return tier->transport_stats().peer_sessions == 2; }));
  auto fetched = tier->Fetch(chunk.key);
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_EQ(fetched->stored.ToString(), chunk.stored());
  EXPECT_EQ(tier->transport_stats().nccl_chunks, 1u);
}

}  // namespace
}  // namespace lazykv::testing
