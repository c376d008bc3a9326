// The llama2.c tokenizer (run.c's encode/decode): characters, then greedy merges of the
// best-scoring adjacent pair, with byte fallback for characters not in the vocabulary.
#include <cstring>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "common/mapped_file.h"
#include "common/status_macros.h"
#include "worker/tokenizer/pair_merge.h"
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
    // Every merge the vocabulary can make: a piece split anywhere into two pieces. The
    // merge loop then looks pairs up by id instead of concatenating strings.
    for (const std::string& piece : pieces_) {
      const int merged = Lookup(piece);
      for (size_t k = 1; k < piece.size(); ++k) {
        const int left = Lookup(std::string_view(piece).substr(0, k));
        const int right = Lookup(std::string_view(piece).substr(k));
        if (left >= 0 && right >= 0) merges_.emplace(PairKey(left, right), merged);
      }
      spaces_lead_ = spaces_lead_ && piece.find_first_not_of(' ') >= piece.rfind(' ') + 1;
    }
  }

  int vocab_size() const override { return static_cast<int>(pieces_.size()); }

  // run.c's greedy merges (the best-scoring adjacent pair first, the leftmost of equals),
  // found with a heap of candidate pairs over a linked list of symbols instead of a scan
  // per merge: O(n log n) where the scan is O(n^2).
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
    std::vector<int32_t> out;
    out.reserve(tokens.size());
    if (!spaces_lead_) {
      MergeInto(tokens, out);
      return out;
    }
    // In a vocabulary whose pieces hold spaces only at their start, no merge joins a
    // non-space to a following space: the text is merged word by word (the same result,
    // with small heaps that stay in cache).
    size_t word = 0;  // the current word's first symbol
    for (size_t i = 1; i <= tokens.size(); ++i) {
      if (i == tokens.size() || (pieces_[tokens[i]].starts_with(' ') && !pieces_[tokens[i - 1]].ends_with(' '))) {
        MergeInto(std::span(tokens).subspan(word, i - word), out);
        word = i;
      }
    }
    return out;
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
    auto it = ids_.find(absl::string_view(piece.data(), piece.size()));
    return it == ids_.end() ? -1 : it->second;
  }

  // Merges `symbols` and appends the result to `out`: the best-scoring pair first, as run.c.
  void MergeInto(std::span<const int32_t> symbols, std::vector<int32_t>& out) const {
    MergeAdjacentPairs<float>(
        std::vector<int32_t>(symbols.begin(), symbols.end()),
        [this](int32_t left, int32_t right) -> std::optional<PairMerge<float>> {
          auto it = merges_.find(PairKey(left, right));
          if (it == merges_.end() || scores_[it->second] <= kNoMerge) return std::nullopt;
          return PairMerge<float>{-scores_[it->second], it->second};  // the highest score merges first
        },
        out);
  }

  static uint64_t PairKey(int32_t left, int32_t right) {
    return static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32 | static_cast<uint32_t>(right);
  }

  // run.c starts its best score at -1e10: pairs scoring no higher never merge.
  static constexpr float kNoMerge = -1e10f;

  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  absl::flat_hash_map<std::string, int32_t> ids_;
  absl::flat_hash_map<uint64_t, int32_t> merges_;  // (left id, right id) -> the merged piece's id
  bool spaces_lead_ = true;                        // every piece's spaces come before its other characters
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
