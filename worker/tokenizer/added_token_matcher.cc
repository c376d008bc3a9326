#include "worker/tokenizer/added_token_matcher.h"

#include <cstring>

namespace lazykv {

AddedTokenMatcher::AddedTokenMatcher(const std::vector<std::pair<std::string, int32_t>>& tokens) : ids_{-1} {
  for (const auto& [text, id] : tokens) {
    if (text.empty()) continue;
    int32_t node = 0;
    for (char c : text) {
      const uint64_t key = static_cast<uint64_t>(node) << 8 | static_cast<uint8_t>(c);
      auto [it, inserted] = edges_.try_emplace(key, static_cast<int32_t>(ids_.size()));
      if (inserted) ids_.push_back(-1);
      node = it->second;
    }
    ids_[node] = id;
    const auto first = static_cast<uint8_t>(text[0]);
    if (!first_[first]) {
      first_[first] = true;
      ++distinct_first_;
      only_first_ = text[0];
    }
  }
}

void AddedTokenMatcher::Split(std::string_view input, absl::FunctionRef<void(std::string_view)> text,
                              absl::FunctionRef<void(int32_t)> token) const {
  size_t plain = 0;  // where the current stretch of plain text starts
  size_t i = 0;
  while (i < input.size()) {
    if (distinct_first_ == 0) break;
    if (distinct_first_ == 1) {
      const void* hit = std::memchr(input.data() + i, only_first_, input.size() - i);
      if (hit == nullptr) break;
      i = static_cast<const char*>(hit) - input.data();
    } else if (!first_[static_cast<uint8_t>(input[i])]) {
      ++i;
      continue;
    }
    // The longest token starting at i.
    int32_t node = 0, best_id = -1;
    size_t best_end = 0;
    for (size_t k = i; k < input.size(); ++k) {
      auto it = edges_.find(static_cast<uint64_t>(node) << 8 | static_cast<uint8_t>(input[k]));
      if (it == edges_.end()) break;
      node = it->second;
      if (ids_[node] >= 0) {
        best_id = ids_[node];
        best_end = k + 1;
      }
    }
    if (best_id < 0) {
      ++i;
      continue;
    }
    if (i > plain) text(input.substr(plain, i - plain));
    token(best_id);
    plain = i = best_end;
  }
  if (plain < input.size()) text(input.substr(plain));
}

}  // namespace lazykv
