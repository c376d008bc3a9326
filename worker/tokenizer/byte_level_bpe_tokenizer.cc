#include "worker/tokenizer/byte_level_bpe_tokenizer.h"

namespace lazykv {

ByteLevelBpeTokenizer::ByteLevelBpeTokenizer(BpeModel model, std::vector<PretokenizerRegex> regexes,
                                             AddedTokenMatcher added, const std::vector<std::string>& token_bytes)
    : model_(std::move(model)), regexes_(std::move(regexes)), added_(std::move(added)) {
  offsets_.reserve(token_bytes.size() + 1);
  offsets_.push_back(0);
  for (const std::string& bytes : token_bytes) {
    bytes_ += bytes;
    offsets_.push_back(static_cast<uint32_t>(bytes_.size()));
  }
}

std::vector<int32_t> ByteLevelBpeTokenizer::Encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  added_.Split(
      text, [&](std::string_view plain) { EncodeText(plain, 0, ids); }, [&](int32_t id) { ids.push_back(id); });
  return ids;
}

void ByteLevelBpeTokenizer::EncodeText(std::string_view text, size_t regex, std::vector<int32_t>& out) const {
  if (regex == regexes_.size()) {
    model_.EncodeWord(text, out);
    return;
  }
  regexes_[regex].Split(text, [&](std::string_view piece) { EncodeText(piece, regex + 1, out); });
}

std::string ByteLevelBpeTokenizer::Decode(std::span<const int32_t> ids) const {
  std::string out;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size()) continue;
    out.append(bytes_, offsets_[id], offsets_[id + 1] - offsets_[id]);
  }
  return out;
}

}  // namespace lazykv
