// The llama2.c tokenizer (run.c's encode/decode): characters, then greedy merges of the
// best-scoring adjacent pair, with byte fallback for characters not in the vocabulary.
#include <cstring>
#include <unordered_map>

#include "absl/strings/str_format.h"
#include "common/mapped_file.h"
#include "common/status_macros.h"
#include "worker/tokenizer/tokenizer.h"

namespace lazykv {
namespace {

constexpr int kByteOffset = 3;  // <unk>, <s>, </s>, then <0x00>..<0xFF>
constexpr int kBosId = 1;
constexpr int kEosId = 2;

class Llama2cTokenizer : public Tokenizer {
 public:
  Llama2cTokenizer(std::vector<std::string> pieces, std::vector<float> scores)
      : pieces_(std::move(pieces)), scores_(std::move(scores)) {
    for (size_t i = 0; i < pieces_.size(); ++i) ids_.emplace(pieces_[i], static_cast<int32_t>(i));  // first wins
  }

  int vocab_size() const override { return static_cast<int>(pieces_.size()); }

  std::vector<int32_t> Encode(std::string_view text) const override {
    std::vector<int32_t> tokens;
    if (text.empty()) return tokens;
    if (int id = Lookup(" "); id >= 0) tokens.push_back(id);  // dummy prefix, as SentencePiece does
    for (size_t i = 0; i < text.size();) {
      // One UTF-8 code point (at most 4 bytes); a stray continuation byte stands alone.
      size_t len = 1;
      while (len < 4 && i + len < text.size() && (static_cast<uint8_t>(text[i + len]) & 0xC0) == 0x80) ++len;
      const std::string_view codepoint = text.substr(i, len);
      if (int id = Lookup(codepoint); id >= 0) {
        tokens.push_back(id);
      } else {
        for (char c : codepoint) tokens.push_back(static_cast<uint8_t>(c) + kByteOffset);
      }
      i += len;
    }
    std::string merged;
    while (true) {
      float best_score = -1e10f;
      int best_id = -1;
      size_t best_index = 0;
      for (size_t i = 0; i + 1 < tokens.size(); ++i) {
        merged = pieces_[tokens[i]] + pieces_[tokens[i + 1]];
        const int id = Lookup(merged);
        if (id >= 0 && scores_[id] > best_score) {
          best_score = scores_[id];
          best_id = id;
          best_index = i;
        }
      }
      if (best_id < 0) break;
      tokens[best_index] = best_id;
      tokens.erase(tokens.begin() + best_index + 1);
    }
    return tokens;
  }

  std::string Decode(std::span<const int32_t> ids) const override {
    std::string out;
    for (int32_t id : ids) {
      if (id == kBosId || id == kEosId || id < 0 || id >= vocab_size()) continue;
      const std::string& piece = pieces_[id];
      unsigned int byte;
      if (piece.size() == 6 && std::sscanf(piece.c_str(), "<0x%02X>", &byte) == 1) {
        out.push_back(static_cast<char>(byte));
      } else {
        out += piece;
      }
    }
    if (!out.empty() && out[0] == ' ') out.erase(0, 1);  // the dummy prefix
    return out;
  }

 private:
  int Lookup(std::string_view piece) const {
    auto it = ids_.find(std::string(piece));
    return it == ids_.end() ? -1 : it->second;
  }

  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::unordered_map<std::string, int32_t> ids_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadLlama2cTokenizer(const std::string& path) {
  ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(path));
  const auto bytes = file.bytes();
  auto bad = [&](const std::string& what) { return absl::InvalidArgumentError(absl::StrFormat("%s: %s", path, what)); };
  if (bytes.size() < 4) return bad("truncated: no max_token_length header");
  int32_t max_token_length;
  std::memcpy(&max_token_length, bytes.data(), 4);
  if (max_token_length <= 0 || max_token_length > 4096) {
    return bad(
        absl::StrFormat("bad header: max_token_length %d (is this a llama2.c tokenizer.bin?)", max_token_length));
  }
  std::vector<std::string> pieces;
  std::vector<float> scores;
  size_t offset = 4;
  while (offset < bytes.size()) {
    if (bytes.size() - offset < 8) return bad(absl::StrFormat("truncated in the header of token %d", pieces.size()));
    float score;
    int32_t len;
    std::memcpy(&score, bytes.data() + offset, 4);
    std::memcpy(&len, bytes.data() + offset + 4, 4);
    offset += 8;
    if (len < 0 || len > max_token_length) {
      return bad(absl::StrFormat("token %d has length %d, outside [0, max_token_length %d]", pieces.size(), len,
                                 max_token_length));
    }
    if (bytes.size() - offset < static_cast<size_t>(len)) {
      return bad(absl::StrFormat("truncated in the text of token %d", pieces.size()));
    }
    pieces.emplace_back(reinterpret_cast<const char*>(bytes.data() + offset), len);
    scores.push_back(score);
    offset += len;
  }
  if (pieces.size() < kByteOffset + 256) {
    return bad(absl::StrFormat("only %d tokens; a llama2.c vocabulary has <unk>, <s>, </s> and 256 byte tokens",
                               pieces.size()));
  }
  return std::make_unique<Llama2cTokenizer>(std::move(pieces), std::move(scores));
}

}  // namespace lazykv
