// SplitMix64: a tiny counter-based generator with the same output on every platform
// (std:: distributions differ between standard libraries; this does not).
#pragma once

#include <cstdint>

namespace lazykv {

inline uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Uniform in [0, 1) with 53 random bits.
inline double SplitMix64Unit(uint64_t& state) { return static_cast<double>(SplitMix64(state) >> 11) * 0x1.0p-53; }

}  // namespace lazykv
