// The CUDA backend's split chunk transfer (backend.h, DESIGN.md section 5): captures ordered
// before later passes and copied out on other threads; stagings from pinned pages (in place by
// the piece copy kernel, or by the copy engines) and from pageable memory by several threads at
// once; the staging budget's refusals and waits; non-finite values refused where they land;
// and the chunk pipeline over the GPU (a fresh engine served from a tier another filled).
// Skips without a GPU.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "cache_server/pinned_memory.h"
#include "gtest/gtest.h"
#include "tests/engine/engine_test_util.h"
#include "tests/fake_chunk_tier.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/test_util.h"
#include "worker/backend/cuda_backend.h"
#include "worker/backend/cuda_copy_pieces.h"
#include "worker/engine/engine.h"
#include "worker/model/synthetic_model.h"

namespace lazykv::testing {
namespace {

// The split transfer: a capture is only enqueued, so its blocks may be overwritten by
// later passes before the copy-out (on another thread) and the copy still holds the old
// KV; payloads staged from pinned 256 KiB pieces and from pageable memory by several
// threads at once import exactly; a staging budget smaller than a chunk refuses it, a full
// one makes a staging wait for room (or refuses it at its deadline); values that are not
// finite are refused where they land.
TEST(CudaBackendTest, CaptureIsOrderedBeforeLaterPassesAndStagingIsThreadSafe) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  const ModelConfig config = *SyntheticConfig("small");
  auto gpu = CreateSyntheticCudaBackend(config, seed, 16, 128);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  Backend& backend = **gpu;
  const std::vector<KvBlockRef> blocks = {{3, 16, 0}, {7, 16, 0}, {1, 13, 0}};
  const std::vector<int32_t> first = RandomTokens(rng, 45, config.vocab_size);
  const std::vector<int32_t> second = RandomTokens(rng, 45, config.vocab_size);
  std::vector<std::vector<float>> unused;
  const SequenceStep step1{first, blocks, LogitsWanted::kNone};
  ASSERT_TRUE(backend.Forward({&step1, 1}, &unused).ok());
  std::string expected;
  ASSERT_TRUE(backend.ExportChunk(blocks, &expected).ok());
  auto captured = backend.CaptureChunk(blocks);
  ASSERT_TRUE(captured.ok()) << captured.status();
  const SequenceStep step2{second, blocks, LogitsWanted::kNone};  // rewrites the same blocks
  ASSERT_TRUE(backend.Forward({&step2, 1}, &unused).ok());
  std::string copied(expected.size(), '\0');
  absl::Status copy_status;
  std::thread publisher([&] {
    // Two pieces, split off the middle: the copy-out honours piece boundaries.
    const size_t half = copied.size() / 2 + 3;
    copy_status = (*captured)->CopyTo(MutablePieces{std::span<char>(copied.data(), half),
                                                    std::span<char>(copied.data() + half, copied.size() - half)});
  });
  publisher.join();
  ASSERT_TRUE(copy_status.ok()) << copy_status;
  EXPECT_TRUE(copied == expected);  // the KV of the first pass, not the second
  std::string now;
  ASSERT_TRUE(backend.ExportChunk(blocks, &now).ok());
  EXPECT_FALSE(now == expected);  // the second pass did rewrite them

  // Four threads stage the first payload at once: from pinned 256 KiB pieces behind a
  // 1000-byte first one (misaligned for the piece copy kernel: the copy engines take it),
  // from a pageable string, and from shuffled pinned pages behind a 128-byte chunk header
  // (as the cache tier's arena holds a chunk: the kernel reads them in place).
  char* pinned = nullptr;
  CUDA_OK(cudaMallocHost(&pinned, expected.size()));
  std::memcpy(pinned, expected.data(), expected.size());
  std::vector<std::string_view> pieces;
  for (size_t at = 0, n = 1000; at < expected.size(); at += n, n = 256 << 10) {
    pieces.emplace_back(pinned + at, std::min(n, expected.size() - at));
  }
  const size_t page = 16 << 10;  // a small chunk: pages small enough that it spans several
  const size_t num_pages = (expected.size() + 128 + page - 1) / page;
  // Pinned as the cache tier pins its arena (in the registry of mapped regions).
  char* arena = static_cast<char*>(std::aligned_alloc(4096, num_pages * page));
  ASSERT_TRUE(cache::PinHostMemory(arena, num_pages * page));
  std::vector<size_t> slot(num_pages);
  std::iota(slot.begin(), slot.end(), 0);
  std::shuffle(slot.begin(), slot.end(), rng);
  std::vector<std::string_view> arena_pieces;
  for (size_t at = 0, p = 0, n = page - 128; at < expected.size(); at += n, n = page, ++p) {
    n = std::min(n, expected.size() - at);
    char* where = arena + slot[p] * page + (p == 0 ? 128 : 0);
    std::memcpy(where, expected.data() + at, n);
    arena_pieces.emplace_back(where, n);
  }
  ASSERT_GT(arena_pieces.size(), 2u);
  // The kernel's case, both ways (else the copy engines would pass this test as well).
  void* probe_range = nullptr;
  CUDA_OK(cudaMalloc(&probe_range, expected.size()));
  EXPECT_TRUE(cuda_backend::PlanKernelCopy(arena_pieces, probe_range, /*to_contiguous=*/true).has_value());
  EXPECT_TRUE(cuda_backend::PlanKernelCopy(arena_pieces, probe_range, /*to_contiguous=*/false).has_value());
  cudaFree(probe_range);
  std::vector<absl::StatusOr<std::unique_ptr<StagedChunk>>> staged;
  for (int t = 0; t < 4; ++t) staged.emplace_back(absl::UnknownError("not run"));
  std::vector<std::thread> stagers;
  for (int t = 0; t < 4; ++t) {
    stagers.emplace_back([&, t] {
      const ChunkBytes bytes = t == 0   ? ChunkBytes(pieces, nullptr)
                               : t == 2 ? ChunkBytes(arena_pieces, nullptr)
                                        : ChunkBytes::FromString(expected);
      staged[t] = backend.StageChunk(bytes, {.check_finite = true});
    });
  }
  for (std::thread& t : stagers) t.join();
  for (int t = 0; t < 4; ++t) {
    ASSERT_TRUE(staged[t].ok()) << staged[t].status();
    const std::vector<KvBlockRef> target = {{20 + 3 * t, 16, 0}, {21 + 3 * t, 16, 0}, {22 + 3 * t, 13, 0}};
    ASSERT_TRUE(backend.ImportStaged(*std::move(staged[t]), target).ok());
    std::string back;
    ASSERT_TRUE(backend.ExportChunk(target, &back).ok());
    EXPECT_TRUE(back == expected) << "stager " << t;
  }
  // A capture copied out into the arena's shuffled pages (the kernel writes them in place)
  // lands exactly there; and a value that is not finite in those pages is refused where
  // it lands by the kernel's own check.
  for (std::string_view piece : arena_pieces) std::memset(const_cast<char*>(piece.data()), 0, piece.size());
  const std::vector<KvBlockRef> holding_expected = {{20, 16, 0}, {21, 16, 0}, {22, 13, 0}};  // stager 0's
  auto recaptured = backend.CaptureChunk(holding_expected);
  ASSERT_TRUE(recaptured.ok()) << recaptured.status();
  MutablePieces arena_out;
  for (std::string_view piece : arena_pieces) arena_out.emplace_back(const_cast<char*>(piece.data()), piece.size());
  ASSERT_TRUE((*recaptured)->CopyTo(arena_out).ok());
  std::string landed;
  for (std::string_view piece : arena_pieces) landed.append(piece);
  EXPECT_TRUE(landed == expected);
  const size_t bad_at = 2 * (rng() % (expected.size() / 2));
  for (size_t i = 0, at = 0; i < arena_pieces.size(); at += arena_pieces[i].size(), ++i) {
    if (bad_at >= at && bad_at < at + arena_pieces[i].size()) {
      const uint16_t inf_bits = 0xFF80;
      std::memcpy(const_cast<char*>(arena_pieces[i].data()) + (bad_at - at), &inf_bits, 2);
    }
  }
  auto refused_in_place = backend.StageChunk(ChunkBytes(arena_pieces, nullptr), {.check_finite = true});
  EXPECT_EQ(refused_in_place.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(refused_in_place.status().message().find(absl::StrCat("at byte ", bad_at)), std::string::npos)
      << refused_in_place.status();
  cache::UnpinHostMemory(arena);
  std::free(arena);
  cudaFreeHost(pinned);
  // Staged bytes for other blocks than they fit are refused.
  auto wrong = backend.StageChunk(ChunkBytes::FromString(expected.substr(4)), {.check_finite = true});
  ASSERT_TRUE(wrong.ok());
  EXPECT_FALSE(backend.ImportStaged(*std::move(wrong), blocks).ok());

  // A budget smaller than one chunk: capture and staging are refused, nothing crashes.
  auto tight = CreateSyntheticCudaBackend(config, seed, 16, 128,
                                          CudaBackendOptions{.transfer_staging_bytes = expected.size() / 2});
  ASSERT_TRUE(tight.ok());
  ASSERT_TRUE((*tight)->Forward({&step1, 1}, &unused).ok());
  auto refused = (*tight)->CaptureChunk(blocks);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  auto refused_stage = (*tight)->StageChunk(ChunkBytes::FromString(expected), {.check_finite = true});
  EXPECT_EQ(refused_stage.status().code(), absl::StatusCode::kResourceExhausted);
  // Larger than the whole budget: no wait makes room.
  const auto start = std::chrono::steady_clock::now();
  refused_stage =
      (*tight)->StageChunk(ChunkBytes::FromString(expected), {.wait_for_room_until = start + std::chrono::seconds(5)});
  EXPECT_EQ(refused_stage.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(4));

  // Room for one chunk: a second staging waits for the first to be imported (which frees
  // its staging), or is refused when its wait ends first.
  auto one = CreateSyntheticCudaBackend(config, seed, 16, 128,
                                        CudaBackendOptions{.transfer_staging_bytes = expected.size() + 4096});
  ASSERT_TRUE(one.ok());
  auto held = (*one)->StageChunk(ChunkBytes::FromString(expected), {});
  ASSERT_TRUE(held.ok()) << held.status();
  auto no_room =
      (*one)->StageChunk(ChunkBytes::FromString(expected),
                         {.wait_for_room_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(50)});
  EXPECT_EQ(no_room.status().code(), absl::StatusCode::kResourceExhausted);
  std::thread importer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    held->reset();  // dropped unimported: its staging goes back, as an import's does
  });
  const auto wait_start = std::chrono::steady_clock::now();
  auto waited = (*one)->StageChunk(ChunkBytes::FromString(expected),
                                   {.wait_for_room_until = wait_start + std::chrono::seconds(10)});
  importer.join();
  // Woken by the release, not by its deadline.
  EXPECT_LT(std::chrono::steady_clock::now() - wait_start, std::chrono::seconds(5));
  ASSERT_TRUE(waited.ok()) << waited.status();
  ASSERT_TRUE((*one)->ImportStaged(*std::move(waited), blocks).ok());

  // A value that is not finite, planted at a random element: refused where it lands,
  // naming its byte (the CPU twin's message).
  std::string poisoned = expected;
  const size_t at = 2 * (rng() % (poisoned.size() / 2));
  const uint16_t nan_bits = 0x7FC1;
  std::memcpy(poisoned.data() + at, &nan_bits, 2);
  auto refused_nan = (*one)->StageChunk(ChunkBytes::FromString(poisoned), {.check_finite = true});
  EXPECT_EQ(refused_nan.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(refused_nan.status().message().find(absl::StrCat("at byte ", at)), std::string::npos)
      << refused_nan.status();
  EXPECT_TRUE((*one)->StageChunk(ChunkBytes::FromString(poisoned), {}).ok()) << "unchecked: staged as it is";
}

// The chunk pipeline over the GPU: a fresh engine served from a tier that a first engine
// filled (captures copied out by publisher threads, fetches staged by pipeline threads)
// generates exactly what the first one did, and fetched every document.
TEST(CudaBackendTest, AWarmTierServesAFreshGpuEngineExactly) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  const ModelConfig config = *SyntheticConfig("small");
  std::vector<std::vector<int32_t>> docs;
  for (int d = 0; d < 5; ++d) docs.push_back(RandomTokens(rng, 20 + rng() % 50, config.vocab_size));
  const std::vector<GenerateRequest> requests = OverlappingRequests(docs, 4, 3, 6, 8, config.vocab_size, rng);
  auto tier = std::make_shared<FakeChunkTier>();
  auto make_engine = [&] {
    auto backend = CreateSyntheticCudaBackend(config, seed, 16, 512);
    EXPECT_TRUE(backend.ok()) << backend.status();
    EngineOptions options;
    options.tier = tier;
    options.pipeline.fetch_policy = FetchPolicy::kAlways;
    return *Engine::Create(*std::move(backend), options);
  };
  std::vector<std::vector<int32_t>> cold_tokens;
  {
    auto cold = make_engine();
    for (const GenerateRequest& request : requests) {
      auto result = cold->Generate(request);
      ASSERT_TRUE(result.ok()) << result.status();
      cold_tokens.push_back(result->tokens);
    }
    cold->pipeline()->Flush();
    EXPECT_EQ(cold->pipeline()->stats().published, docs.size() + 1);  // and the anchor
  }
  auto warm = make_engine();
  int fetched_tokens = 0;
  for (size_t r = 0; r < requests.size(); ++r) {
    auto result = warm->Generate(requests[r]);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->tokens, cold_tokens[r]) << r;
    EXPECT_EQ(result->usage.chunk_misses, 0);
    fetched_tokens += result->usage.host_tokens;
  }
  EXPECT_GT(fetched_tokens, 0);
  EXPECT_EQ(warm->pipeline()->stats().fetched, docs.size() + 1);
}

}  // namespace
}  // namespace lazykv::testing
