// Switches read from the environment to turn an optimisation off for comparisons within one
// binary (e.g. LAZYKV_DEPENDENT_LAUNCH=0): on unless the variable is "0". Callers read a
// switch once (a function-local static) and keep it for the process.
#pragma once

#include <cstdlib>
#include <cstring>

namespace lazykv {

inline bool EnvSwitchOn(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr || std::strcmp(value, "0") != 0;
}

}  // namespace lazykv
