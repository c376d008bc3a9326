// A cache tier holding forged chunks (another document's real KV under a key, NaNs,
// chunks signed with another key or not at all): with the fleet's MAC key, a worker refuses
// each of them before it reaches attention, counts it and computes the chunk, so outputs
// equal the engine without a tier. Without a key, non-finite values are still refused.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "common/chunk_codec.h"
#include "common/chunk_mac.h"
#include "tests/engine/engine_test_util.h"
#include "tests/fake_chunk_tier.h"
#include "tests/test_util.h"
#include "worker/model/model_loader.h"

namespace lazykv {
namespace {

using testing::FakeChunkTier;

std::unique_ptr<Engine> EngineWithTier(const ModelWeights& weights, std::shared_ptr<FakeChunkTier> tier,
                                       std::shared_ptr<const ChunkMac> mac) {
  EngineOptions options;
  options.tier = std::move(tier);
  options.pipeline.fetch_policy = FetchPolicy::kAlways;
  options.pipeline.mac = std::move(mac);
  return testing::MakeEngine(weights, std::move(options));
}

// The stored form of `payload` under `header`'s key and layout, signed by `mac` (or not).
std::string Forge(ChunkHeader header, const std::string& payload, const ChunkMac* mac) {
  header.payload_checksum = ChunkPayloadChecksum(payload);
  header.mac = {};
  if (mac != nullptr) {
    const std::string_view view(payload);
    header.mac = mac->Sign(header, std::span(&view, 1));
  }
  return EncodeChunk(header, payload);
}

TEST(PoisonedTierTest, ForgedChunksNeverChangeAnOutput) {
  const uint64_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  const ModelWeights weights = *LoadModel("synthetic:tiny:" + std::to_string(rng() % 1000));
  const int vocab = weights.config.vocab_size;
  // Documents of one length, so that one document's chunk fits another's layout.
  std::vector<std::vector<int32_t>> docs;
  for (int d = 0; d < 4; ++d) docs.push_back(testing::RandomTokens(rng, 24, vocab));
  std::vector<GenerateRequest> requests;
  for (int r = 0; r < 3; ++r) {
    GenerateRequest request;
    request.docs = {docs[r], docs[(r + 1) % 4]};
    request.prompt = testing::RandomTokens(rng, 5, vocab);
    request.sampling.max_tokens = 6;
    requests.push_back(request);
  }
  std::vector<std::vector<int32_t>> expected;
  auto reference = testing::MakeEngine(weights, AttentionMode::kLazy);
  for (const GenerateRequest& request : requests) expected.push_back(reference->Generate(request)->tokens);

  const auto fleet = std::make_shared<const ChunkMac>(std::string(32, 'f'));
  const ChunkMac other_fleet(std::string(32, 'o'));
  for (int variant = 0; variant < 5; ++variant) {
    SCOPED_TRACE(::testing::Message() << "variant " << variant);
    auto tier = std::make_shared<FakeChunkTier>();
    {
      auto cold = EngineWithTier(weights, tier, fleet);  // publishes signed chunks
      for (const GenerateRequest& request : requests) ASSERT_TRUE(cold->Generate(request).ok());
      cold->pipeline()->Flush();
    }
    const auto published = tier->published();
    ASSERT_GE(published.size(), 5u);  // the anchor and four documents
    int forged = 0;
    for (size_t i = 0; i < published.size(); ++i) {
      auto view = DecodeChunk(published[i].stored);
      ASSERT_TRUE(view.ok()) << view.status();
      ASSERT_TRUE(fleet->Verify(view->header, std::span(&view->payload, 1)).ok()) << "published unsigned";
      if (view->header.layout.anchor_tokens == 0) continue;  // the anchor: forge the documents
      std::string payload(view->payload);
      const ChunkMac* signer = nullptr;
      switch (variant) {
        case 0: {  // another document's real, signed KV under this key (its tag kept)
          const auto& other = published[(i + 1) % published.size()];
          auto other_view = DecodeChunk(other.stored);
          if (other_view->header.layout.anchor_tokens == 0) continue;
          ChunkHeader header = view->header;
          header.payload_checksum = ChunkPayloadChecksum(other_view->payload);
          header.mac = other_view->header.mac;
          tier->Store(published[i].key, EncodeChunk(header, other_view->payload));
          ++forged;
          continue;
        }
        case 1:  // NaNs, unsigned
        case 2:  // NaNs, signed with the fleet's key (a faulty worker)
        case 4:  // NaNs, unsigned, to a worker without a key
          for (size_t b = 0; b + 4 <= payload.size(); b += 4) {
            const float nan = std::nanf("");
            std::memcpy(&payload[b], &nan, 4);
          }
          signer = variant == 2 ? fleet.get() : nullptr;
          break;
        case 3:  // plausible values, signed with another fleet's key
          for (char& c : payload) c = static_cast<char>(c ^ 0x01);
          signer = &other_fleet;
          break;
      }
      tier->Store(published[i].key, Forge(view->header, payload, signer));
      ++forged;
    }
    ASSERT_GT(forged, 0);
    auto engine = EngineWithTier(weights, tier, variant == 4 ? nullptr : fleet);
    for (size_t r = 0; r < requests.size(); ++r) {
      auto result = engine->Generate(requests[r]);
      ASSERT_TRUE(result.ok()) << result.status();
      EXPECT_EQ(result->tokens, expected[r]) << "request " << r;
    }
    EXPECT_GE(engine->pipeline()->stats().chunks_rejected, static_cast<uint64_t>(forged));
    EXPECT_GT(engine->pipeline()->stats().fetched, 0u);  // the anchor, untouched, still came from the tier
    testing::ExpectNoLeakedBlocks(*engine);
  }
}

}  // namespace
}  // namespace lazykv
