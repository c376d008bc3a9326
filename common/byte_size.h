// Byte sizes on command lines: "8GiB", "512MiB", "64k", "1.5G", "4096".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace lazykv {

// Binary suffixes (KiB, MiB, GiB, TiB, and K/M/G/T, case-insensitive, optional B) are
// powers of 1024; decimal ones (KB, MB, GB, TB) powers of 1000.
absl::StatusOr<uint64_t> ParseByteSize(std::string_view text);
std::string FormatByteSize(uint64_t bytes);

}  // namespace lazykv
