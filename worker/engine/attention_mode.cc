#include "worker/engine/attention_mode.h"

#include "absl/strings/str_cat.h"

namespace lazykv {

absl::StatusOr<AttentionMode> ParseAttentionMode(std::string_view name) {
  if (name == "none") return AttentionMode::kNone;
  if (name == "prefix") return AttentionMode::kPrefix;
  if (name == "block") return AttentionMode::kBlock;
  if (name == "lazy") return AttentionMode::kLazy;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown mode '", std::string(name), "'; expected none, prefix, block or lazy"));
}

std::string_view AttentionModeName(AttentionMode mode) {
  switch (mode) {
    case AttentionMode::kNone:
      return "none";
    case AttentionMode::kPrefix:
      return "prefix";
    case AttentionMode::kBlock:
      return "block";
    case AttentionMode::kLazy:
      return "lazy";
  }
  return "unknown";
}

}  // namespace lazykv
