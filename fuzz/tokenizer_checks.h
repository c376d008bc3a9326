// Checks shared by the two tokenizer fuzzers.
#pragma once

#include <algorithm>
#include <span>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "worker/tokenizer/tokenizer.h"

namespace lazykv::fuzz {

// Decoding ignores ids outside the vocabulary (never crashes on them), and decoding a
// continuation split anywhere works.
inline void CheckDecode(const Tokenizer& tokenizer, const std::vector<int32_t>& ids, size_t split) {
  std::vector<int32_t> inside;
  for (int32_t id : ids) {
    if (id >= 0 && id < tokenizer.vocab_size()) inside.push_back(id);
  }
  FUZZ_CHECK(tokenizer.Decode(ids) == tokenizer.Decode(inside));
  split = std::min(split, ids.size());
  const std::span<const int32_t> all(ids);
  (void)DecodeContinuation(tokenizer, all.subspan(0, split), all.subspan(split));
}

}  // namespace lazykv::fuzz
