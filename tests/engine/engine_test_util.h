// Building engines over given weights for tests.
#pragma once

#include <memory>

#include "gtest/gtest.h"
#include "worker/backend/cpu_backend.h"
#include "worker/engine/engine.h"

namespace lazykv::testing {

inline std::unique_ptr<Engine> MakeEngine(const ModelWeights& weights, AttentionMode mode, int block_size = 16,
                                          int num_blocks = 2048, int max_prefill_tokens = 512) {
  auto backend = CreateCpuBackend(weights, block_size, num_blocks);
  EXPECT_TRUE(backend.ok()) << backend.status();
  EngineOptions options;
  options.mode = mode;
  options.max_prefill_tokens = max_prefill_tokens;
  auto engine = Engine::Create(*std::move(backend), options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return *std::move(engine);
}

// Every block is free or held by the cache index: no request leaked a reference.
inline void ExpectNoLeakedBlocks(const Engine& engine) {
  const EngineStats s = engine.stats();
  EXPECT_EQ(static_cast<size_t>(s.free_blocks) + s.cached_blocks, static_cast<size_t>(s.num_blocks));
}

}  // namespace lazykv::testing
