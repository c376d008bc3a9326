// The independent reference of lazy and block attention (and of the repair): the naive
// dense forward pass (tests/test_util.h) over an explicit layout with explicit positions and
// a mask, written without the engine's block tables:
//   - the anchor at [0, a);
//   - each document k at its logical positions [s_k, s_k + len_k), encoded alone: its rows
//     attend causally to themselves and to their own copy of the anchor at [s_k - a, s_k)
//     (a document's KV is computed after the anchor alone: DESIGN.md section 2);
//   - with a repair (GenerateRequest::repair_tokens), for each document but the first, its
//     first r_k = min(repair, len_k) tokens again at the same positions ("repaired rows"),
//     attending to the anchor, to what earlier documents show the rest of the sequence,
//     and causally to each other;
//   - what a document shows later tokens: its repaired rows, then its encoded rows from r_k
//     on (its encoded first r_k rows stay visible to its own encoded rows only);
//   - the prompt (then each generated token) after everything, attending to what every
//     document shows and causally to itself.
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "tests/test_util.h"
#include "worker/engine/engine.h"
#include "worker/model/model_weights.h"

namespace lazykv::testing {

// Logits of the reference from the prompt's last token on: entry s is what the engine's
// step s (record_logits) must equal. REQUIRES: a non-empty prompt.
inline std::vector<std::vector<float>> PlacedDocumentsReference(const ModelWeights& w,
                                                                const std::vector<int32_t>& anchor,
                                                                const std::vector<std::vector<int32_t>>& docs,
                                                                const std::vector<int32_t>& prompt,
                                                                const std::vector<int32_t>& generated,
                                                                int repair = 0) {
  enum class Kind { kAnchor, kCopy, kEncodedHead, kEncodedRest, kRepaired, kTail };
  std::vector<int32_t> tokens;
  std::vector<int64_t> positions;
  std::vector<Kind> kind;
  std::vector<int> doc_of;
  auto add = [&](int32_t token, int64_t position, Kind k, int doc) {
    tokens.push_back(token);
    positions.push_back(position);
    kind.push_back(k);
    doc_of.push_back(doc);
  };
  const int64_t a = static_cast<int64_t>(anchor.size());
  for (int64_t i = 0; i < a; ++i) add(anchor[i], i, Kind::kAnchor, -1);
  int64_t start = a;
  int d = 0;
  for (const auto& doc : docs) {
    if (doc.empty()) continue;
    const int64_t r = d == 0 ? 0 : std::min<int64_t>(repair, static_cast<int64_t>(doc.size()));
    for (int64_t i = 0; i < a; ++i) add(anchor[i], start - a + i, Kind::kCopy, d);
    for (int64_t j = 0; j < static_cast<int64_t>(doc.size()); ++j) {
      add(doc[j], start + j, j < r ? Kind::kEncodedHead : Kind::kEncodedRest, d);
    }
    for (int64_t j = 0; j < r; ++j) add(doc[j], start + j, Kind::kRepaired, d);
    start += static_cast<int64_t>(doc.size());
    ++d;
  }
  const size_t tail_begin = tokens.size();
  std::vector<int32_t> tail = prompt;
  tail.insert(tail.end(), generated.begin(), generated.end());
  for (size_t j = 0; j < tail.size(); ++j) add(tail[j], start + static_cast<int64_t>(j), Kind::kTail, -1);

  auto shown = [&](size_t key) { return kind[key] == Kind::kEncodedRest || kind[key] == Kind::kRepaired; };
  auto visible = [&](size_t q, size_t key) {
    if (key > q) return false;  // rows are laid out so that everything a row sees is before it
    switch (kind[q]) {
      case Kind::kAnchor:
        return kind[key] == Kind::kAnchor;
      case Kind::kCopy:
      case Kind::kEncodedHead:
      case Kind::kEncodedRest:  // the document encoded alone after its anchor copy
        return doc_of[key] == doc_of[q] && kind[key] != Kind::kRepaired;
      case Kind::kRepaired:
        return kind[key] == Kind::kAnchor || (doc_of[key] < doc_of[q] && shown(key)) ||
               (doc_of[key] == doc_of[q] && kind[key] == Kind::kRepaired);
      case Kind::kTail:
        return kind[key] == Kind::kAnchor || kind[key] == Kind::kTail || shown(key);
    }
    return false;
  };
  std::vector<bool> want(tokens.size(), false);
  for (size_t i = tail_begin + prompt.size() - 1; i < tokens.size(); ++i) want[i] = true;
  auto logits = NaiveForwardMasked(w, tokens, positions, visible, want);
  return std::vector<std::vector<float>>(logits.begin() + tail_begin + prompt.size() - 1, logits.end());
}

// 2 to 4 random documents of 1 to 30 tokens, a prompt of 1 to 9, 4 tokens to generate with
// their logits recorded.
inline GenerateRequest RandomPlacedRequest(std::mt19937_64& rng, int vocab) {
  GenerateRequest request;
  const int docs = std::uniform_int_distribution<int>(2, 4)(rng);
  for (int d = 0; d < docs; ++d) {
    request.docs.push_back(RandomTokens(rng, std::uniform_int_distribution<int>(1, 30)(rng), vocab));
  }
  request.prompt = RandomTokens(rng, std::uniform_int_distribution<int>(1, 9)(rng), vocab);
  request.sampling.max_tokens = 4;
  request.record_logits = true;
  return request;
}

}  // namespace lazykv::testing
