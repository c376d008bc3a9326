// SentencePiece .model files through libsentencepiece, kept apart from the rest of the
// process in a module loaded with dlopen (RTLD_LOCAL | RTLD_DEEPBIND):
// - Debian's libsentencepiece carries its own copy of protobuf-lite and exports those
//   symbols; loaded globally next to libprotobuf (gRPC), the two copies interpose each
//   other and the process crashes at start-up, depending on library order.
// - Its header also declares its own absl::string_view, which clashes with Abseil's, so
//   the module (sentencepiece_module.cc) includes no Abseil header.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace lazykv {

// Encode and Decode are const and thread-safe (SentencePieceProcessor's are).
class SentencePieceModel {
 public:
  virtual ~SentencePieceModel() = default;
  // nullptr and a message in *error when the module or the file cannot be loaded.
  static std::unique_ptr<SentencePieceModel> Load(const std::string& path, std::string* error);

  virtual std::vector<int32_t> Encode(const std::string& text) const = 0;
  virtual std::string Decode(const std::vector<int32_t>& ids) const = 0;  // control ids are skipped
  virtual int size() const = 0;
};

}  // namespace lazykv

// The module's one entry point (C linkage, for dlsym).
extern "C" lazykv::SentencePieceModel* lazykv_sentencepiece_load(const char* path, std::string* error);
