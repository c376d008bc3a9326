// Shared test helpers: where the trained checkpoints live, fresh random seeds, and an
// independent naive Llama forward pass (dense attention with explicit positions and mask,
// no paging, no lazy RoPE).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "nlohmann/json.hpp"
#include "worker/engine/engine.h"
#include "worker/model/model_weights.h"
#include "worker/tokenizer/tokenizer.h"

namespace lazykv::testing {

// ../shared/models (LAZYKV_MODELS_DIR overrides), or "" when that folder is absent: the
// tests that need it skip then.
std::string ModelsDir();
bool HaveModel(const std::string& file);
std::string ModelPath(const std::string& file);
// ../shared/tokenizers/llama3 (beside the models folder), or "" when absent.
std::string Llama3TokenizerDir();
// The Llama 3 tokenizer.json of that folder, loaded once for the whole test program (it
// takes a second); null when the folder is absent. Thread-safe.
const Tokenizer* Llama3Tokenizer();
// A JSON Lines file, one value per non-empty line (the reference vectors' format).
std::vector<nlohmann::json> ReadJsonLines(const std::string& path);

// How much slower than a plain build this run is: LAZYKV_TEST_SLOWDOWN (the
// ThreadSanitizer run sets it), default 1. Tests that race a deadline or a grace period
// against real work multiply their times by it.
int SlowdownFactor();

// A fresh seed per call (printed by the caller's SCOPED_TRACE for reproduction), or
// LAZYKV_TEST_SEED's where set, for every call (to run a failure's seed again: filter to its test).
uint64_t FreshSeed();

// Polls `predicate` every 10 ms until it holds or `limit` (times SlowdownFactor) passes;
// returns its last answer.
template <typename Predicate>
bool Eventually(Predicate predicate, std::chrono::milliseconds limit = std::chrono::milliseconds(5000)) {
  const auto until = std::chrono::steady_clock::now() + limit * SlowdownFactor();
  while (std::chrono::steady_clock::now() < until) {
    if (predicate()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return predicate();
}

// Logits at every position of `tokens`, computed plainly over the whole sequence.
std::vector<std::vector<float>> NaiveForward(const ModelWeights& w, const std::vector<int32_t>& tokens);

// The same dense forward pass with explicit RoPE positions and an explicit mask: token
// `query` attends to token `key` iff visible(query, key) (each token must see at least
// itself). Logits only where want_logits (elsewhere empty). Its RoPE frequencies are
// computed here, not by the code under test.
std::vector<std::vector<float>> NaiveForwardMasked(const ModelWeights& w, const std::vector<int32_t>& tokens,
                                                   const std::vector<int64_t>& positions,
                                                   const std::function<bool(size_t, size_t)>& visible,
                                                   const std::vector<bool>& want_logits);

// max |a - b| / max |b|: error relative to the reference's scale; infinity where the sizes
// differ or an element is NaN or infinite on one side only (NaN on both sides too).
double RelativeError(const std::vector<float>& a, const std::vector<float>& reference);

std::vector<int32_t> RandomTokens(std::mt19937_64& rng, int length, int vocab_size);
// `n` requests of `docs_per_request` documents each, request r taking documents r, r + 1, ...
// (modulo their number: neighbouring requests share documents at other positions), each
// with a random prompt of `prompt_tokens` and `max_tokens` to generate.
std::vector<GenerateRequest> OverlappingRequests(const std::vector<std::vector<int32_t>>& docs, int n,
                                                 int docs_per_request, int prompt_tokens, int max_tokens,
                                                 int vocab_size, std::mt19937_64& rng);

}  // namespace lazykv::testing
