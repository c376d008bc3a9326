// Switches read from the environment to turn an optimisation off for comparisons within one
// binary (e.g. LAZYKV_DEPENDENT_LAUNCH=0): on unless the variable is "0"; switches that turn a
// slower alternative on (EnvSwitchSet: off unless set and not "0"); and counts that
// force a choice for measurements (e.g. LAZYKV_DECODE_SPLITS=16). Callers read a switch or
// count once (a function-local static) and keep it for the process.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace lazykv {

inline bool EnvSwitchOn(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr || std::strcmp(value, "0") != 0;
}

// Whether the variable is set to something other than "0": switches that are off by default.
inline bool EnvSwitchSet(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && std::strcmp(value, "0") != 0;
}

// The count in the variable; 0 when it is unset, negative or not a number (the caller's own
// choice stands).
inline int EnvCount(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? 0 : std::max(0, std::atoi(value));
}

}  // namespace lazykv
