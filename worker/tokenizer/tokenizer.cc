#include "worker/tokenizer/tokenizer.h"

#include <filesystem>

#include "absl/strings/str_format.h"

namespace lazykv {
namespace {

class ByteTokenizer : public Tokenizer {
 public:
  explicit ByteTokenizer(int vocab_size) : vocab_size_(vocab_size) {}
  int vocab_size() const override { return vocab_size_; }

  std::vector<int32_t> Encode(std::string_view text) const override {
    std::vector<int32_t> ids;
    ids.reserve(text.size());
    for (char c : text) ids.push_back(static_cast<uint8_t>(c) + kOffset);
    return ids;
  }

  std::string Decode(std::span<const int32_t> ids) const override {
    std::string out;
    for (int32_t id : ids) {
      if (id >= kOffset && id < kOffset + 256) {
        out.push_back(static_cast<char>(id - kOffset));
      } else if (id >= kOffset + 256) {
        out += "\xEF\xBF\xBD";  // U+FFFD: an id with no byte behind it
      }
    }
    return out;
  }

 private:
  static constexpr int kOffset = 3;
  int vocab_size_;
};

}  // namespace

std::string DecodeContinuation(const Tokenizer& tokenizer, std::span<const int32_t> prefix,
                               std::span<const int32_t> ids) {
  std::vector<int32_t> all(prefix.begin(), prefix.end());
  all.insert(all.end(), ids.begin(), ids.end());
  const std::string before = tokenizer.Decode(prefix);
  std::string after = tokenizer.Decode(all);
  if (after.compare(0, before.size(), before) == 0) return after.substr(before.size());
  return tokenizer.Decode(ids);  // the prefix's decoding changed at the seam: fall back
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    for (const char* name : {"tokenizer.json", "tokenizer.model", "tokenizer.bin"}) {
      if (fs::exists(fs::path(path) / name, ec)) return LoadTokenizer((fs::path(path) / name).string());
    }
    return absl::NotFoundError(
        absl::StrFormat("%s: a directory with no tokenizer.json, tokenizer.model or tokenizer.bin", path));
  }
  const fs::path extension = fs::path(path).extension();
  if (extension == ".json") return LoadHfTokenizer(path);
  if (extension == ".model") return LoadSentencePieceTokenizer(path);
  return LoadLlama2cTokenizer(path);
}

absl::StatusOr<std::unique_ptr<Tokenizer>> MakeByteTokenizer(int vocab_size) {
  if (vocab_size < 259) {
    return absl::InvalidArgumentError(
        absl::StrFormat("byte tokenizer needs a vocabulary of at least 259 ids, the model has %d", vocab_size));
  }
  return std::make_unique<ByteTokenizer>(vocab_size);
}

}  // namespace lazykv
