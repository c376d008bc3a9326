// Cat(...): concatenates strings, string_views, characters arrays and numbers. Debian 12's
// Abseil has its own absl::string_view (not std::string_view), so absl::StrCat does not
// take the std::string_view this engine uses throughout.
#pragma once

#include <string>
#include <string_view>
#include <type_traits>

#include "absl/strings/string_view.h"

namespace lazykv::jinja {

template <typename... Args>
std::string Cat(const Args&... args) {
  std::string out;
  auto append = [&out](const auto& a) {
    using T = std::decay_t<decltype(a)>;
    if constexpr (std::is_same_v<T, absl::string_view>) {
      out.append(a.data(), a.size());
    } else if constexpr (std::is_arithmetic_v<T>) {
      out += std::to_string(a);
    } else {
      out += std::string_view(a);
    }
  };
  (append(args), ...);
  return out;
}

}  // namespace lazykv::jinja
