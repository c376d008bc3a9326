#include "common/security/secret_file.h"

#include <sys/stat.h>

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace lazykv {

absl::StatusOr<std::string> ReadSecretFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream contents;
  contents << in.rdbuf();
  return std::string(absl::StripAsciiWhitespace(contents.str()));
}

std::string FileVersion(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return "";
  return absl::StrFormat("%d.%09d/%d/%d", st.st_mtim.tv_sec, st.st_mtim.tv_nsec, st.st_size, st.st_ino);
}

}  // namespace lazykv
