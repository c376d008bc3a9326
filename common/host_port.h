// HOST:PORT addresses as the servers take them ("127.0.0.1:50051", "[::1]:0",
// "cache-0.cache:7070").
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace lazykv {

struct HostPort {
  std::string host;  // without the brackets of an IPv6 literal
  int port = 0;      // 0..65535
};

// INVALID_ARGUMENT naming the address when it has no ":PORT" or the port is not a number
// in 0..65535.
absl::StatusOr<HostPort> ParseHostPort(std::string_view address);

}  // namespace lazykv
