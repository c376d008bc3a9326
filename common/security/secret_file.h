// Reading the small files that hold secrets (tokens, keys) and telling when they change.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace lazykv {

// The file's whole contents, trimmed of surrounding whitespace; NOT_FOUND naming the path.
absl::StatusOr<std::string> ReadSecretFile(const std::string& path);

// What identifies a version of a file without reading it (modification time, size,
// inode); empty when it cannot be stat'ed. A rename over the file changes it.
std::string FileVersion(const std::string& path);

}  // namespace lazykv
