// A thin wrapper over libsentencepiece that includes no Abseil header: the Debian build
// of sentencepiece declares its own absl::string_view, which clashes with Abseil's, so
// the two may never meet in one translation unit.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace lazykv {

class SentencePieceModel {
 public:
  // nullptr and a message in *error when the file is not a valid model.
  static std::unique_ptr<SentencePieceModel> Load(const std::string& path, std::string* error);
  ~SentencePieceModel();

  std::vector<int32_t> Encode(const std::string& text) const;
  std::string Decode(const std::vector<int32_t>& ids) const;  // control ids are skipped
  int size() const;

 private:
  struct Impl;
  explicit SentencePieceModel(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace lazykv
