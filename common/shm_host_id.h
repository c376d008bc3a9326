// Which host (and boot) this process runs on, for the same-host transport (DESIGN.md
// section 5): the kernel's random boot id, the same in every process and container of a
// host until it reboots, and different on any other host. A cache server sends its own;
// a worker maps the server's arena only when they match, so a pid and fd that happen to
// name a similar memfd on another host are never taken for the server's arena.
#pragma once

#include <fstream>
#include <string>

namespace lazykv {

// The 36-character boot id, or "" when the kernel does not expose one.
inline std::string HostBootId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return id;
}

}  // namespace lazykv
