#include "common/byte_size.h"

#include <cctype>
#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"

namespace lazykv {

absl::StatusOr<uint64_t> ParseByteSize(std::string_view text) {
  size_t split = 0;
  while (split < text.size() && (std::isdigit(static_cast<unsigned char>(text[split])) || text[split] == '.')) ++split;
  const std::string number(text.substr(0, split));
  const std::string suffix = absl::AsciiStrToLower(std::string(text.substr(split)));
  double value = 0;
  if (number.empty() || !absl::SimpleAtod(number, &value)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("'%s' is not a byte size (e.g. 4096, 64MiB, 8GiB)", std::string(text)));
  }
  double scale;
  if (suffix.empty() || suffix == "b")
    scale = 1;
  else if (suffix == "k" || suffix == "kib" || suffix == "ki")
    scale = 1024.0;
  else if (suffix == "m" || suffix == "mib" || suffix == "mi")
    scale = 1024.0 * 1024;
  else if (suffix == "g" || suffix == "gib" || suffix == "gi")
    scale = 1024.0 * 1024 * 1024;
  else if (suffix == "t" || suffix == "tib" || suffix == "ti")
    scale = 1024.0 * 1024 * 1024 * 1024;
  else if (suffix == "kb")
    scale = 1e3;
  else if (suffix == "mb")
    scale = 1e6;
  else if (suffix == "gb")
    scale = 1e9;
  else if (suffix == "tb")
    scale = 1e12;
  else {
    return absl::InvalidArgumentError(
        absl::StrFormat("'%s': unknown size suffix '%s' (use KiB, MiB, GiB, TiB)", std::string(text), suffix));
  }
  const double bytes = value * scale;
  if (!(bytes < 1.8e19)) return absl::InvalidArgumentError(absl::StrFormat("'%s' is too large", std::string(text)));
  return static_cast<uint64_t>(std::llround(bytes));
}

std::string FormatByteSize(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  return unit == 0 ? absl::StrFormat("%d B", bytes) : absl::StrFormat("%.1f %s", value, units[unit]);
}

}  // namespace lazykv
