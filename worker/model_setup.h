// Builds what every entry point needs from command-line choices: the model, its
// tokenizer, a backend and an engine.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/engine.h"
#include "worker/tokenizer.h"

namespace lazykv {

struct ModelSetupOptions {
  std::string model;      // path, HF directory, or synthetic:NAME[:SEED]
  std::string tokenizer;  // empty: next to the model, or bytes for synthetic models
  int block_size = 16;
  uint64_t kv_pool_bytes = 256ull << 20;
  EngineOptions engine;
};

struct LoadedEngine {
  std::unique_ptr<Engine> engine;
  std::unique_ptr<Tokenizer> tokenizer;
};

absl::StatusOr<LoadedEngine> SetUpEngine(const ModelSetupOptions& options);

}  // namespace lazykv
