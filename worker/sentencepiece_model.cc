#include "worker/sentencepiece_model.h"

#include <sentencepiece_processor.h>

namespace lazykv {

struct SentencePieceModel::Impl {
  sentencepiece::SentencePieceProcessor processor;
};

SentencePieceModel::SentencePieceModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SentencePieceModel::~SentencePieceModel() = default;

std::unique_ptr<SentencePieceModel> SentencePieceModel::Load(const std::string& path, std::string* error) {
  auto impl = std::make_unique<Impl>();
  const auto status = impl->processor.Load(path);
  if (!status.ok()) {
    *error = status.ToString();
    return nullptr;
  }
  return std::unique_ptr<SentencePieceModel>(new SentencePieceModel(std::move(impl)));
}

std::vector<int32_t> SentencePieceModel::Encode(const std::string& text) const {
  std::vector<int> ids;
  if (!impl_->processor.Encode(text, &ids).ok()) return {};
  return std::vector<int32_t>(ids.begin(), ids.end());
}

std::string SentencePieceModel::Decode(const std::vector<int32_t>& ids) const {
  std::vector<int> kept;
  for (int32_t id : ids) {
    if (id >= 0 && id < size() && !impl_->processor.IsControl(id)) kept.push_back(id);
  }
  std::string out;
  if (!impl_->processor.Decode(kept, &out).ok()) return {};
  return out;
}

int SentencePieceModel::size() const { return impl_->processor.GetPieceSize(); }

}  // namespace lazykv
