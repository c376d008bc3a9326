// The cache server's GPU tier on a real GPU, fetched through CUDA IPC (issue 17): a chunk
// published to a lazykv-cache-server with --gpu-capacity reaches its GPU tier; a worker's
// tier fetches it device to device (the payload never on the host), byte for byte what was
// stored, under a lease that goes when the bytes do; and a fresh CUDA engine served from the
// GPU tier generates exactly what the engine that computed the chunks did. Skips without a
// GPU.
#include <cuda_runtime.h>

#include <filesystem>
#include <random>
#include <thread>

#include "gtest/gtest.h"
#include "tests/cache_server/cache_test_util.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/test_util.h"
#include "worker/backend/cuda_backend.h"
#include "worker/engine/engine.h"
#include "worker/model/synthetic_model.h"
#include "worker/tier/remote_chunk_tier.h"

namespace lazykv::testing {
namespace {

using std::chrono::milliseconds;

std::unique_ptr<RemoteChunkTier> GpuTierClient(const std::string& address, int gpu_device,
                                               milliseconds lookup_lease_hold = milliseconds(2000)) {
  RemoteTierOptions options;
  options.lookup_lease_hold = lookup_lease_hold;
  options.servers = {address};
  options.holder = "cuda-gpu-tier-test";
  options.initial_call_deadline = milliseconds(2000);
  options.transport = FetchTransport::kShm;
  options.gpu_device = gpu_device;
  auto tier = RemoteChunkTier::Create(options);
  EXPECT_TRUE(tier.ok()) << tier.status();
  return *std::move(tier);
}

// Polls lookups (of a client of its own, whose lookups lease nothing) until every key is in
// the server's GPU tier.
bool AllOnGpu(const std::string& address, const std::vector<Hash128>& keys) {
  auto poller = GpuTierClient(address, -1, milliseconds(0));
  return Eventually(
      [&] {
        size_t on_gpu = 0;
        for (const auto& hit : poller->Lookup(keys)) on_gpu += hit && hit->server_tier == "gpu" ? 1 : 0;
        return on_gpu == keys.size();
      },
      milliseconds(10000));
}

class CudaGpuTierTest : public CacheServerTest {
 protected:
  CudaGpuTierTest() : CacheServerTest("cuda_gpu_tier") {}
  void SetUp() override {
    if (!HaveGpu()) GTEST_SKIP() << "no GPU";
    CacheServerTest::SetUp();
    ASSERT_TRUE(StartServer({"--gpu-capacity", "256MiB", "--host-capacity", "256MiB", "--disk-capacity", "0"}));
  }
};

TEST_F(CudaGpuTierTest, AChunkInTheGpuTierIsFetchedDeviceToDeviceExactly) {
  SCOPED_TRACE(seed_);
  std::vector<TestChunk> chunks;
  std::vector<Hash128> keys;
  for (int i = 0; i < 3; ++i) {
    chunks.push_back(RandomTestChunk(rng_, std::uniform_int_distribution<size_t>(1 << 20, 9 << 20)(rng_)));
    keys.push_back(chunks.back().key);
    ASSERT_TRUE(PutChunk(*stub_, chunks.back()).status.ok());
  }
  ASSERT_TRUE(AllOnGpu(server_->address(), keys));
  auto tier = GpuTierClient(server_->address(), 0);
  // One lookup, as the pipeline's: it leases each chunk's GPU tier copy for the fetch.
  for (const auto& hit : tier->Lookup(keys)) ASSERT_TRUE(hit.has_value() && hit->server_tier == "gpu");
  for (const TestChunk& chunk : chunks) {
    const std::string stored = chunk.stored();
    auto fetched = tier->Fetch(chunk.key);
    ASSERT_TRUE(fetched.ok()) << fetched.status();
    ASSERT_TRUE(fetched->stored.on_device()) << "the payload came through host memory";
    EXPECT_EQ(fetched->stored.on_device_from(), kChunkHeaderBytes);
    ASSERT_EQ(fetched->stored.size(), stored.size());
    std::string header(kChunkHeaderBytes, '\0');
    fetched->stored.CopyTo(0, kChunkHeaderBytes, header.data());
    EXPECT_EQ(header, stored.substr(0, kChunkHeaderBytes));
    std::string payload;
    const ChunkBytes device_part = fetched->stored.Slice(kChunkHeaderBytes, stored.size());
    for (std::string_view piece : device_part.pieces()) {
      const size_t at = payload.size();
      payload.resize(at + piece.size());
      ASSERT_EQ(cudaMemcpy(payload.data() + at, piece.data(), piece.size(), cudaMemcpyDefault), cudaSuccess);
    }
    EXPECT_EQ(payload, stored.substr(kChunkHeaderBytes)) << "device bytes differ from what was stored";
    EXPECT_GE(Stats(*stub_).shm_leases(), 1u);
  }
  // Each fetch took the GPU tier lease of the lookup: device to device with no call of its own.
  EXPECT_EQ(tier->transport_stats().lookup_leases_used, chunks.size());
  // The leases go with the bytes.
  (void)Eventually([&] { return Stats(*stub_).shm_leases() == 0; });
  EXPECT_EQ(Stats(*stub_).shm_leases(), 0u);
  EXPECT_EQ(tier->transport_stats().cuda_ipc_chunks, chunks.size());
  EXPECT_EQ(tier->transport_stats().shm_chunks, 0u);
}

TEST_F(CudaGpuTierTest, AFreshEngineServedFromTheGpuTierGeneratesExactlyTheSame) {
  SCOPED_TRACE(seed_);
  const ModelConfig config = *SyntheticConfig("small");
  std::vector<std::vector<int32_t>> docs;
  for (int d = 0; d < 4; ++d) docs.push_back(RandomTokens(rng_, 20 + rng_() % 60, config.vocab_size));
  const std::vector<GenerateRequest> requests = OverlappingRequests(docs, 3, 3, 5, 8, config.vocab_size, rng_);
  auto make_engine = [&](std::shared_ptr<ChunkTier> tier) {
    auto backend = CreateSyntheticCudaBackend(config, seed_, 16, 512);
    EXPECT_TRUE(backend.ok()) << backend.status();
    EngineOptions options;
    options.tier = std::move(tier);
    options.pipeline.fetch_policy = FetchPolicy::kAlways;
    return *Engine::Create(*std::move(backend), options);
  };
  std::vector<std::vector<int32_t>> cold_tokens;
  {
    auto cold = make_engine(std::shared_ptr<ChunkTier>(GpuTierClient(server_->address(), 0)));
    for (const GenerateRequest& request : requests) {
      auto result = cold->Generate(request);
      ASSERT_TRUE(result.ok()) << result.status();
      cold_tokens.push_back(result->tokens);
    }
    cold->pipeline()->Flush();
  }
  std::shared_ptr<RemoteChunkTier> warm_tier = GpuTierClient(server_->address(), 0);
  auto warm = make_engine(warm_tier);
  int fetched_tokens = 0;
  for (size_t r = 0; r < requests.size(); ++r) {
    auto result = warm->Generate(requests[r]);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->tokens, cold_tokens[r]) << r;
    EXPECT_EQ(result->usage.chunk_misses, 0);
    fetched_tokens += result->usage.remote_tokens;
  }
  EXPECT_GT(fetched_tokens, 0);
  EXPECT_GT(warm_tier->transport_stats().cuda_ipc_chunks, 0u) << "nothing came from the GPU tier";
  std::printf("warm engine: %d document tokens fetched, %llu chunks device to device, %llu from host RAM\n",
              fetched_tokens, static_cast<unsigned long long>(warm_tier->transport_stats().cuda_ipc_chunks),
              static_cast<unsigned long long>(warm_tier->transport_stats().shm_chunks));
}

}  // namespace
}  // namespace lazykv::testing
