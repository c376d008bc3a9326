// Infinity-or-NaN tests on raw element bits (bf16 as uint16_t, fp32 as uint32_t): all-ones
// exponent bits mark one. Shared by the value check and the checking piece copy.
#pragma once

#include <cstdint>

namespace lazykv::cuda {

template <typename Bits>
__device__ inline bool NonFinite(Bits v) {
  constexpr Bits kMask = sizeof(Bits) == 2 ? Bits(0x7F80) : Bits(0x7F800000u);
  return (v & kMask) == kMask;
}

// The first non-finite element among the 16-byte vector's, as a byte offset from the
// vector, or -1.
template <typename Bits>
__device__ inline int FirstNonFiniteIn(const uint4& vec) {
  const Bits* e = reinterpret_cast<const Bits*>(&vec);
#pragma unroll
  for (int i = 0; i < static_cast<int>(16 / sizeof(Bits)); ++i) {
    if (NonFinite(e[i])) return i * static_cast<int>(sizeof(Bits));
  }
  return -1;
}

}  // namespace lazykv::cuda
