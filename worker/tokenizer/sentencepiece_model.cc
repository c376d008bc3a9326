#include "worker/tokenizer/sentencepiece_model.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>

namespace lazykv {
namespace {

using LoadFn = SentencePieceModel* (*)(const char*, std::string*);

// The module sits next to the executable (build/bin, or a bundle); the build path and
// $LAZYKV_SENTENCEPIECE_MODULE are the other places looked at.
std::vector<std::string> ModuleCandidates() {
  std::vector<std::string> paths;
  if (const char* env = std::getenv("LAZYKV_SENTENCEPIECE_MODULE"); env != nullptr && *env) paths.push_back(env);
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) paths.push_back((exe.parent_path() / "liblazykv_sentencepiece.so").string());
  paths.push_back(LAZYKV_SENTENCEPIECE_MODULE);
  return paths;
}

LoadFn LoadModule(std::string* error) {
  static std::once_flag once;
  static LoadFn load = nullptr;
  static std::string load_error;
  std::call_once(once, [] {
    for (const std::string& path : ModuleCandidates()) {
      void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
      if (handle == nullptr) {
        load_error += std::string(dlerror()) + "; ";
        continue;
      }
      load = reinterpret_cast<LoadFn>(dlsym(handle, "lazykv_sentencepiece_load"));
      if (load != nullptr) return;
      load_error += path + ": no lazykv_sentencepiece_load; ";
    }
  });
  if (load == nullptr) *error = "cannot load the SentencePiece module: " + load_error;
  return load;
}

}  // namespace

std::unique_ptr<SentencePieceModel> SentencePieceModel::Load(const std::string& path, std::string* error) {
  const LoadFn load = LoadModule(error);
  if (load == nullptr) return nullptr;
  return std::unique_ptr<SentencePieceModel>(load(path.c_str(), error));
}

}  // namespace lazykv
