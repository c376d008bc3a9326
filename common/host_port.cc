#include "common/host_port.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace lazykv {

absl::StatusOr<HostPort> ParseHostPort(std::string_view address) {
  const size_t colon = address.rfind(':');
  auto invalid = [&] { return absl::InvalidArgumentError(absl::StrCat("'", std::string(address), "': expected HOST:PORT")); };
  if (colon == std::string_view::npos || colon == 0) return invalid();
  std::string_view host = address.substr(0, colon);
  if (host.front() == '[') {
    if (host.size() < 3 || host.back() != ']') return invalid();
    host = host.substr(1, host.size() - 2);
  } else if (host.find(':') != std::string_view::npos) {
    return invalid();  // an IPv6 literal needs its brackets
  }
  int port = -1;
  const std::string port_text(address.substr(colon + 1));
  if (!absl::SimpleAtoi(port_text, &port) || port < 0 || port > 65535) return invalid();
  return HostPort{std::string(host), port};
}

}  // namespace lazykv
