// Admission reserves what a request will hold, no more (a baseline that reserves extra
// runs fewer requests at once, and a comparison with it measures admission, not
// attention), and never less (the pool must not run out under admitted requests).
#include <algorithm>
#include <random>

#include "gtest/gtest.h"
#include "tests/engine/engine_test_util.h"
#include "tests/test_util.h"
#include "worker/model/synthetic_model.h"

namespace lazykv::testing {
namespace {

int CeilDiv(int a, int b) { return (a + b - 1) / b; }

// Block counts of a request's layout, from its tokens (an anchor of `anchor_tokens`: BOS
// is one token, an anchorless engine none).
struct Layout {
  int whole_sequence = 0;  // none and prefix: anchor, documents, prompt, tokens fed back
  int own = 0;             // lazy and block: the own tail (prompt or last document, tokens fed back)
  int chunks = 0;          // the anchor (if any) and each distinct non-empty shared document
  int unmoved = 0;         // of those, what block mode keeps in place: anchor and first document
  int moved = 0;           // block mode's copies: every later non-empty shared document
};

Layout CountLayout(const GenerateRequest& request, int bs, int anchor_tokens) {
  Layout layout;
  const int fed = std::max(request.sampling.max_tokens - 1, 0);
  int total = anchor_tokens + static_cast<int>(request.prompt.size()) + fed;
  for (const auto& doc : request.docs) total += static_cast<int>(doc.size());
  layout.whole_sequence = CeilDiv(total, bs);
  const bool last_doc_is_own = request.prompt.empty();
  const size_t shared = last_doc_is_own ? request.docs.size() - 1 : request.docs.size();
  layout.own =
      CeilDiv(static_cast<int>(last_doc_is_own ? request.docs.back().size() : request.prompt.size()) + fed, bs);
  layout.chunks = layout.unmoved = CeilDiv(anchor_tokens, bs);
  std::vector<std::vector<int32_t>> distinct;
  bool first = true;
  for (size_t d = 0; d < shared; ++d) {
    const auto& doc = request.docs[d];
    if (doc.empty()) continue;
    const int blocks = CeilDiv(static_cast<int>(doc.size()), bs);
    if (first) {
      layout.unmoved += blocks;
    } else {
      layout.moved += blocks;
    }
    first = false;
    if (std::find(distinct.begin(), distinct.end(), doc) == distinct.end()) {
      distinct.push_back(doc);
      layout.chunks += blocks;
    }
  }
  return layout;
}

struct Peaks {
  int reserved = 0;       // the most blocks reserved at once
  int allocated = 0;      // the most blocks allocated at once (held + cached)
  int reserved_last = 0;  // reserved before the last step (block mode: after the copies)
  GenerateResult result;
};

// Runs one request alone on a fresh engine, step by step. Between steps, what is held
// (CountHeldBlocks: not evictable) never exceeds what is reserved.
Peaks RunAlone(Engine& engine, const GenerateRequest& request) {
  Peaks peaks;
  auto id = engine.Submit(request);
  EXPECT_TRUE(id.ok()) << id.status();
  std::vector<EngineEvent> events;
  while (engine.HasWork()) {
    const int reserved = engine.stats().reserved_blocks;
    peaks.reserved = std::max(peaks.reserved, reserved);
    peaks.reserved_last = reserved;
    EXPECT_LE(engine.CountHeldBlocks(), reserved);
    engine.Step(&events);
    EXPECT_LE(engine.CountHeldBlocks(), std::max(reserved, engine.stats().reserved_blocks));
  }
  peaks.allocated = engine.stats().peak_used_blocks;
  for (const EngineEvent& event : events) {
    EXPECT_NE(event.kind, EngineEvent::Kind::kFailed) << event.status;
    if (event.kind == EngineEvent::Kind::kFinished) peaks.result = *event.result;
  }
  return peaks;
}

TEST(EngineReservationTest, ReservedEqualsPeakHeldInEveryMode) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  const ModelWeights weights = RandomModel("tiny", seed);
  const int vocab = weights.config.vocab_size;
  int exact_checks = 0;
  for (int round = 0; round < 12; ++round) {
    const int bs = std::uniform_int_distribution<int>(2, 16)(rng);
    GenerateRequest request;
    const int docs = std::uniform_int_distribution<int>(0, 4)(rng);
    for (int d = 0; d < docs; ++d) {
      // Some empty documents (no positions, no blocks), some repeated.
      const int length = std::uniform_int_distribution<int>(-3, 40)(rng);
      if (d > 0 && length % 5 == 0) {
        request.docs.push_back(request.docs.front());
      } else {
        request.docs.push_back(RandomTokens(rng, std::max(length, 0), vocab));
      }
    }
    request.prompt = RandomTokens(rng, std::uniform_int_distribution<int>(round % 3 == 0 ? 0 : 1, 12)(rng), vocab);
    if (request.prompt.empty() && (request.docs.empty() || request.docs.back().empty())) {
      request.prompt = RandomTokens(rng, 3, vocab);
    }
    request.sampling.max_tokens = std::uniform_int_distribution<int>(0, 20)(rng);
    for (const bool anchorless : {false, true}) {
      for (AttentionMode mode :
           {AttentionMode::kNone, AttentionMode::kPrefix, AttentionMode::kLazy, AttentionMode::kBlock}) {
        SCOPED_TRACE(::testing::Message() << "round " << round << " mode " << AttentionModeName(mode) << " block size "
                                          << bs << (anchorless ? " anchorless" : " BOS anchor"));
        EngineOptions options;
        options.mode = mode;
        options.anchorless = anchorless;  // no anchor chunk: nothing reserved or held for one
        auto engine = MakeEngine(weights, std::move(options), bs, 1024);
        const Peaks peaks = RunAlone(*engine, request);
        EXPECT_EQ(peaks.reserved, engine->ReservedBlocks(request));
        ExpectNoLeakedBlocks(*engine);
        if (peaks.result.finish_reason != "length") continue;  // stopped early: held less
        ++exact_checks;
        const Layout layout = CountLayout(request, bs, anchorless ? 0 : 1);
        // On a fresh engine with room to spare nothing is evicted: the peak of blocks in use
        // is what the request needed, and admission reserved exactly that.
        switch (mode) {
          case AttentionMode::kNone:
          case AttentionMode::kPrefix:
            EXPECT_EQ(peaks.reserved, layout.whole_sequence);
            EXPECT_EQ(peaks.allocated, layout.whole_sequence);
            break;
          case AttentionMode::kLazy:
            EXPECT_EQ(peaks.reserved, layout.chunks + layout.own);
            EXPECT_EQ(peaks.allocated, layout.chunks + layout.own);
            break;
          case AttentionMode::kBlock:
            // Sources, copies and tail are reserved together (during the copy both sources
            // and copies are held, and another request may keep a source alive past it);
            // once copied, the sources' reservation is let go.
            EXPECT_EQ(peaks.reserved, layout.chunks + layout.moved + layout.own);
            EXPECT_EQ(peaks.allocated, layout.chunks + layout.moved + layout.own);
            if (layout.moved > 0 && request.sampling.max_tokens > 1) {
              EXPECT_EQ(peaks.reserved_last, layout.unmoved + layout.moved + layout.own);
            }
            break;
        }
      }
    }
  }
  EXPECT_GT(exact_checks, 48) << "too few requests ran to max_tokens to check the peaks exactly";
}

TEST(EngineReservationTest, ConcurrentRequestsSharingDocumentsNeverHoldMoreThanReserved) {
  // Requests that share and repeat documents, in a pool that fits only a few at once:
  // between steps the held blocks stay within the reservations (block mode lets go of
  // copied sources that other requests may still use), and no request fails for room.
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  const ModelWeights weights = RandomModel("tiny", seed);
  std::vector<std::vector<int32_t>> corpus;
  for (int d = 0; d < 6; ++d) {
    corpus.push_back(RandomTokens(rng, std::uniform_int_distribution<int>(5, 40)(rng), weights.config.vocab_size));
  }
  for (AttentionMode mode :
       {AttentionMode::kNone, AttentionMode::kPrefix, AttentionMode::kLazy, AttentionMode::kBlock}) {
    SCOPED_TRACE(AttentionModeName(mode));
    auto engine = MakeEngine(weights, mode, /*block_size=*/4, /*num_blocks=*/160, /*max_prefill_tokens=*/24);
    int finished = 0, submitted = 0;
    std::vector<EngineEvent> events;
    for (int r = 0; r < 16; ++r) {
      GenerateRequest request;
      const int docs = std::uniform_int_distribution<int>(1, 4)(rng);
      for (int d = 0; d < docs; ++d) request.docs.push_back(corpus[std::uniform_int_distribution<int>(0, 5)(rng)]);
      request.prompt = RandomTokens(rng, 4, weights.config.vocab_size);
      request.sampling.max_tokens = std::uniform_int_distribution<int>(1, 12)(rng);
      ASSERT_TRUE(engine->Submit(request).ok());
      ++submitted;
    }
    while (engine->HasWork()) {
      const int reserved_before = engine->stats().reserved_blocks;
      events.clear();
      engine->Step(&events);
      ASSERT_LE(engine->CountHeldBlocks(), std::max(reserved_before, engine->stats().reserved_blocks));
      ASSERT_LE(engine->stats().reserved_blocks, engine->stats().num_blocks);
      for (const EngineEvent& event : events) {
        ASSERT_NE(event.kind, EngineEvent::Kind::kFailed) << event.status;
        finished += event.kind == EngineEvent::Kind::kFinished;
      }
    }
    EXPECT_EQ(finished, submitted);
    ExpectNoLeakedBlocks(*engine);
  }
}

}  // namespace
}  // namespace lazykv::testing
