// The dlopen'ed side of sentencepiece_model.h: the only code that touches libsentencepiece.
#include <sentencepiece_processor.h>

#include "worker/tokenizer/sentencepiece_model.h"

namespace lazykv {
namespace {

class ProcessorModel final : public SentencePieceModel {
 public:
  sentencepiece::SentencePieceProcessor processor;

  std::vector<int32_t> Encode(const std::string& text) const override {
    std::vector<int> ids;
    if (!processor.Encode(text, &ids).ok()) return {};
    return std::vector<int32_t>(ids.begin(), ids.end());
  }

  std::string Decode(const std::vector<int32_t>& ids) const override {
    std::vector<int> kept;
    for (int32_t id : ids) {
      if (id >= 0 && id < size() && !processor.IsControl(id)) kept.push_back(id);
    }
    std::string out;
    if (!processor.Decode(kept, &out).ok()) return {};
    return out;
  }

  int size() const override { return processor.GetPieceSize(); }
};

}  // namespace
}  // namespace lazykv

extern "C" lazykv::SentencePieceModel* lazykv_sentencepiece_load(const char* path, std::string* error) {
  auto model = std::make_unique<lazykv::ProcessorModel>();
  const auto status = model->processor.Load(path);
  if (!status.ok()) {
    *error = status.ToString();
    return nullptr;
  }
  return model.release();
}
