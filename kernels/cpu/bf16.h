// bfloat16 on the CPU: the rounding the CUDA backend applies wherever it stores a value in
// bf16 (__float2bfloat16: round to nearest, ties to even; NaN to the canonical 0x7fff),
// bit for bit, and the exact conversion back. Used by the CPU backend's GPU-like numerics
// (worker/backend/cpu_backend.h) and its bf16 chunk payloads.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>

namespace lazykv::cpu {

inline uint16_t FloatToBf16Bits(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fff;  // NaN
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

inline float Bf16BitsToFloat(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

// The nearest bf16 value, as a float.
inline float RoundToBf16(float f) { return Bf16BitsToFloat(FloatToBf16Bits(f)); }

inline void RoundToBf16(float* values, size_t n) {
  for (size_t i = 0; i < n; ++i) values[i] = RoundToBf16(values[i]);
}

}  // namespace lazykv::cpu
