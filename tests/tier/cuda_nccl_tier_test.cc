// Chunks across GPUs over NCCL (issue 18), with real processes: a lazykv-cache-server whose
// GPU tier is on GPU 0 and a worker's tier on GPU 1 forced to the link (--transport nccl).
// Chunks arrive in GPU 1's memory byte for byte; a worker that goes after asking for a chunk
// but before receiving it leaves the server's send to be aborted (NCCL's abort ends the
// kernel that waits for it), and the server goes on serving the next worker; a server
// killed under a worker ends its fetches with an error, never a hang. Skips without NCCL or
// a second GPU. References: the chunks as built (TestChunk), read back with cudaMemcpy.
#include <cuda_runtime.h>
#include <signal.h>

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

class CudaNcclTierTest : public CacheServerTest {
 protected:
  CudaNcclTierTest() : CacheServerTest("cuda_nccl_tier") {}
  void SetUp() override {
    int gpus = 0;
    if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus < 2) GTEST_SKIP() << "fewer than 2 GPUs";
    if (absl::Status nccl = PeerLinkAvailable("nccl"); !nccl.ok()) GTEST_SKIP() << nccl;
    CacheServerTest::SetUp();
    ASSERT_TRUE(StartServer({"--gpu-capacity", "256MiB", "--gpu-device", "0", "--host-capacity", "256MiB",
                             "--disk-capacity", "0"}));
  }
  std::unique_ptr<RemoteChunkTier> LinkClient() {
    RemoteTierOptions options;
    options.servers = {server_->address()};
    options.holder = "cuda-nccl-tier-test";
    options.initial_call_deadline = milliseconds(2000);
    options.transport = FetchTransport::kNccl;
    options.gpu_device = 1;
    options.peer_links_per_server = 2;
    auto tier = RemoteChunkTier::Create(options);
    EXPECT_TRUE(tier.ok()) << tier.status();
    return *std::move(tier);
  }
  bool OnGpu(const Hash128& key) { return ReachesTier(*stub_, key, v1::TIER_GPU, milliseconds(10000)); }
  // The chunk's bytes as fetched: the header from host memory, the payload copied back from
  // GPU 1.
  static std::string ReadBack(const ChunkBytes& bytes) {
    std::string out(bytes.on_device_from(), '\0');
    bytes.CopyTo(0, out.size(), out.data());
    const ChunkBytes device_part = bytes.Slice(bytes.on_device_from(), bytes.size());
    for (std::string_view piece : device_part.pieces()) {
      cudaPointerAttributes attributes{};
      EXPECT_EQ(cudaPointerGetAttributes(&attributes, piece.data()), cudaSuccess);
      EXPECT_EQ(attributes.device, 1) << "the payload is not in GPU 1's memory";
      const size_t at = out.size();
      out.resize(at + piece.size());
      EXPECT_EQ(cudaMemcpy(out.data() + at, piece.data(), piece.size(), cudaMemcpyDefault), cudaSuccess);
    }
    return out;
  }
};

TEST_F(CudaNcclTierTest, ChunksReachTheOtherGpuExactly) {
  SCOPED_TRACE(seed_);
  std::vector<TestChunk> chunks;
  for (int i = 0; i < 4; ++i) {
    chunks.push_back(RandomTestChunk(rng_, std::uniform_int_distribution<size_t>(1 << 20, 24 << 20)(rng_)));
    ASSERT_TRUE(PutChunk(*stub_, chunks.back()).status.ok());
    ASSERT_TRUE(OnGpu(chunks.back().key));
  }
  std::unique_ptr<RemoteChunkTier> tier = LinkClient();
  ASSERT_TRUE(Eventually([&] { return tier->transport_stats().peer_sessions == 2; }, milliseconds(30000)))
      << "the NCCL link did not come up";
  for (int round = 0; round < 2; ++round) {
    for (const TestChunk& chunk : chunks) {
      auto fetched = tier->Fetch(chunk.key);
      ASSERT_TRUE(fetched.ok()) << fetched.status();
      ASSERT_TRUE(fetched->stored.on_device());
      EXPECT_EQ(fetched->stored.on_device_from(), kChunkHeaderBytes);
      EXPECT_EQ(ReadBack(fetched->stored), chunk.stored()) << "round " << round;
    }
  }
  EXPECT_EQ(tier->transport_stats().nccl_chunks, 2 * chunks.size());
  EXPECT_EQ(tier->transport_stats().cuda_ipc_chunks, 0u) << "--transport nccl never uses CUDA IPC";
  EXPECT_EQ(Stats(*stub_).peer_transfers_failed(), 0u);
}

TEST_F(CudaNcclTierTest, AWorkerThatNeverReceivesIsAbortedAndTheNextIsServed) {
  SCOPED_TRACE(seed_);
  // Larger than NCCL's buffers between the two GPUs (a send of 16 MiB completed with no
  // receive posted once the link was connected): the send can only end by the abort.
  const TestChunk chunk = RandomTestChunk(rng_, 160 << 20);
  ASSERT_TRUE(PutChunk(*stub_, chunk).status.ok());
  ASSERT_TRUE(OnGpu(chunk.key));
  {
    grpc::ClientContext context;
    auto stream = stub_->PeerLinkSession(&context);
    v1::PeerLinkSessionRequest request;
    request.set_holder("never-receives");
    request.set_kind("nccl");
    ASSERT_TRUE(stream->Write(request));
    v1::PeerLinkSessionResponse answer;
    ASSERT_TRUE(stream->Read(&answer));
    auto link = ConnectPeerLink(PeerLinkOptions{.kind = "nccl", .device = 1, .cancel = nullptr}, answer.link_id(), 1,
                                PeerLinkClock::now() + milliseconds(30000));
    ASSERT_TRUE(link.ok()) << link.status();
    grpc::ClientContext get_context;
    v1::PeerGetRequest get;
    get.set_session_id(answer.session_id());
    *get.mutable_key() = ToProto(chunk.key);
    v1::PeerGetResponse got;
    ASSERT_TRUE(stub_->PeerGet(&get_context, get, &got).ok());
    ASSERT_TRUE(got.found());
    std::this_thread::sleep_for(milliseconds(200));  // the server's send kernel waits for us
    context.TryCancel();                             // and we go
    (void)stream->Finish();
    (*link)->Abort();
  }
  // Well within the send's own 10 s deadline: the abort ended it.
  EXPECT_TRUE(Eventually([&] { return Stats(*stub_).peer_transfers_failed() == 1; }, milliseconds(4000)))
      << "the server's send was not aborted";
  EXPECT_EQ(Stats(*stub_).peer_sessions(), 0u);
  std::unique_ptr<RemoteChunkTier> tier = LinkClient();
  ASSERT_TRUE(Eventually([&] { return tier->transport_stats().peer_sessions == 2; }, milliseconds(30000)));
  auto fetched = tier->Fetch(chunk.key);
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_EQ(ReadBack(fetched->stored), chunk.stored());
  EXPECT_EQ(tier->transport_stats().nccl_chunks, 1u) << "a chunk over 64 MiB: asked again with a larger buffer";
}

TEST_F(CudaNcclTierTest, AKilledServerEndsFetchesWithAnErrorNotAHang) {
  SCOPED_TRACE(seed_);
  const TestChunk chunk = RandomTestChunk(rng_, 8 << 20);
  ASSERT_TRUE(PutChunk(*stub_, chunk).status.ok());
  ASSERT_TRUE(OnGpu(chunk.key));
  std::unique_ptr<RemoteChunkTier> tier = LinkClient();
  ASSERT_TRUE(Eventually([&] { return tier->transport_stats().peer_sessions == 2; }, milliseconds(30000)));
  ASSERT_TRUE(tier->Fetch(chunk.key).ok());
  server_->Stop(SIGKILL);
  const auto start = std::chrono::steady_clock::now();
  auto fetched = tier->Fetch(chunk.key);
  EXPECT_FALSE(fetched.ok());
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(10000));
  EXPECT_TRUE(Eventually([&] { return tier->transport_stats().peer_sessions == 0; }, milliseconds(10000)))
      << "the session outlived its server";
}

}  // namespace
}  // namespace lazykv::testing
