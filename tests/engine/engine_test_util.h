// Building engines over given weights for tests.
#pragma once

#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "worker/backend/cpu_backend.h"
#include "worker/engine/engine.h"
#include "worker/model/synthetic_model.h"

namespace lazykv::testing {

// An engine with `options` over a CPU backend of the weights.
inline std::unique_ptr<Engine> MakeEngine(const ModelWeights& weights, EngineOptions options, int block_size = 16,
                                          int num_blocks = 2048) {
  auto backend = CreateCpuBackend(weights, block_size, num_blocks);
  EXPECT_TRUE(backend.ok()) << backend.status();
  auto engine = Engine::Create(*std::move(backend), std::move(options));
  EXPECT_TRUE(engine.ok()) << engine.status();
  return *std::move(engine);
}

inline std::unique_ptr<Engine> MakeEngine(const ModelWeights& weights, AttentionMode mode, int block_size = 16,
                                          int num_blocks = 2048, int max_prefill_tokens = 512) {
  EngineOptions options;
  options.mode = mode;
  options.max_prefill_tokens = max_prefill_tokens;
  return MakeEngine(weights, std::move(options), block_size, num_blocks);
}

// An engine in `mode` with the given anchor (empty: the model's BOS).
inline std::unique_ptr<Engine> MakeEngineWithAnchor(const ModelWeights& weights, AttentionMode mode, int block_size,
                                                    std::vector<int32_t> anchor, int max_prefill_tokens = 512) {
  EngineOptions options;
  options.mode = mode;
  options.anchor = std::move(anchor);
  options.max_prefill_tokens = max_prefill_tokens;
  return MakeEngine(weights, std::move(options), block_size);
}

// A random model of a synthetic shape ("tiny", "tiny-hf", "tiny-llama3", ...), drawn from `seed`.
inline ModelWeights RandomModel(const std::string& shape, uint64_t seed) {
  auto config = SyntheticConfig(shape);
  EXPECT_TRUE(config.ok()) << config.status();
  return MakeSyntheticWeights(*config, seed);
}

// Steps `engine` until it has no work, expecting no request to fail and `requests` to end.
inline void StepUntilIdle(Engine& engine, int requests) {
  std::vector<EngineEvent> events;
  int ended = 0;
  while (engine.HasWork()) {
    events.clear();
    engine.Step(&events);
    for (const EngineEvent& e : events) {
      EXPECT_NE(e.kind, EngineEvent::Kind::kFailed) << e.status;
      if (e.kind == EngineEvent::Kind::kFinished || e.kind == EngineEvent::Kind::kFailed) ++ended;
    }
  }
  EXPECT_EQ(ended, requests);
}

// Every block is free or held by the cache index: no request leaked a reference.
inline void ExpectNoLeakedBlocks(const Engine& engine) {
  const EngineStats s = engine.stats();
  EXPECT_EQ(static_cast<size_t>(s.free_blocks) + s.cached_blocks, static_cast<size_t>(s.num_blocks));
}

}  // namespace lazykv::testing
