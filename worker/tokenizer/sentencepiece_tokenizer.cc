// SentencePiece .model files through libsentencepiece (see sentencepiece_model.h).
#include "absl/strings/str_format.h"
#include "worker/tokenizer/sentencepiece_model.h"
#include "worker/tokenizer/tokenizer.h"

namespace lazykv {
namespace {

class SentencePieceTokenizer : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(std::unique_ptr<SentencePieceModel> model) : model_(std::move(model)) {}

  int vocab_size() const override { return model_->size(); }
  std::vector<int32_t> Encode(std::string_view text) const override { return model_->Encode(std::string(text)); }
  std::string Decode(std::span<const int32_t> ids) const override {
    return model_->Decode(std::vector<int32_t>(ids.begin(), ids.end()));
  }

 private:
  std::unique_ptr<SentencePieceModel> model_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadSentencePieceTokenizer(const std::string& path) {
  std::string error;
  auto model = SentencePieceModel::Load(path, &error);
  if (model == nullptr) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: not a valid SentencePiece model: %s", path, error));
  }
  return std::make_unique<SentencePieceTokenizer>(std::move(model));
}

}  // namespace lazykv
