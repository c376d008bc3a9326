// Helpers shared by the libFuzzer targets in this folder (see fuzz/CMakeLists.txt and
// scripts/fuzz.sh): a fatal invariant check, where the trained models live, and a
// private scratch directory for targets whose code under test reads files.
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

// An invariant the code under test must keep: on violation print it and abort, which
// libFuzzer reports as a crash and saves the input.
#define FUZZ_CHECK(cond)                                                                   \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      std::fprintf(stderr, "%s:%d: fuzz invariant violated: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                        \
    }                                                                                      \
  } while (0)

namespace lazykv::fuzz {

// The chunk MAC key of chunk_codec_fuzzer and of the seeds make_seeds writes for it.
inline constexpr std::string_view kTestMacKey = "lazykv fuzz: a fixed test key, not a secret.";

// ../shared/models next to the source tree, or $LAZYKV_MODELS_DIR (as tests/test_util.cc
// finds it); "" when absent.
inline std::string ModelsDir() {
  std::string dir = LAZYKV_SOURCE_DIR "/../shared/models";
  if (const char* env = std::getenv("LAZYKV_MODELS_DIR"); env != nullptr && *env) dir = env;
  return std::filesystem::is_directory(dir) ? dir : "";
}

// The path of `file` in ModelsDir(), or "" when it is not there.
inline std::string ModelPath(const std::string& file) {
  const std::string dir = ModelsDir();
  if (dir.empty()) return "";
  const std::string path = dir + "/" + file;
  return std::filesystem::exists(path) ? path : "";
}

// A directory of this process's own under $TMPDIR (or /tmp), removed at exit.
inline const std::string& ScratchDir() {
  // Never destroyed: the exit handler below runs after static destructors would have.
  static const std::string* const dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    auto* path = new std::string(std::string(tmp != nullptr && *tmp ? tmp : "/tmp") + "/lazykv-fuzz-XXXXXX");
    if (::mkdtemp(path->data()) == nullptr) {
      std::perror("mkdtemp");
      std::abort();
    }
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(ScratchDir(), ec);
    });
    return path;
  }();
  return *dir;
}

// Writes `bytes` to `path` (replacing it); aborts when the write fails, which is the
// harness's fault, not the code's under test.
inline void WriteFile(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) {
    std::fprintf(stderr, "fuzz harness: cannot write %s\n", path.c_str());
    std::abort();
  }
}

}  // namespace lazykv::fuzz
