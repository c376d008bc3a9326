#include "worker/model/model_loader.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "worker/model/llama2c_loader.h"
#include "worker/model/safetensors_loader.h"
#include "worker/model/synthetic_model.h"

namespace lazykv {

absl::StatusOr<ModelWeights> LoadModel(const std::string& spec) {
  namespace fs = std::filesystem;
  if (spec.starts_with("synthetic:")) return LoadSyntheticModel(spec);
  std::error_code ec;
  if (fs::is_directory(spec, ec)) return LoadHfCheckpoint(spec);
  if (spec.ends_with(".safetensors") || fs::path(spec).filename() == "config.json") {
    return LoadHfCheckpoint(fs::path(spec).parent_path().string());
  }
  if (!fs::exists(spec, ec)) {
    return absl::NotFoundError(absl::StrCat("model ", spec, ": no such file or directory (or use synthetic:NAME)"));
  }
  return LoadLlama2cCheckpoint(spec);
}

}  // namespace lazykv
