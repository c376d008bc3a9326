// The four ways the engine treats documents (DESIGN.md section 2), behind one option.
#pragma once

#include <string_view>

#include "absl/status/statusor.h"

namespace lazykv {

enum class AttentionMode {
  kNone,    // no reuse; full causal attention over the whole prompt
  kPrefix,  // reuse the longest cached prefix (block-hash chain from position 0)
  kBlock,   // position-free chunk KV, re-rotated into a fresh copy per request
  kLazy,    // position-free chunk KV, zero-copy; the query is rotated by each chunk's delta
};

absl::StatusOr<AttentionMode> ParseAttentionMode(std::string_view name);
std::string_view AttentionModeName(AttentionMode mode);

}  // namespace lazykv
