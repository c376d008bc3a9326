// Loads and stores of either element type (element_type.h) as fp32 values in device code:
// a bf16 store rounds to nearest even, an fp32 store is exact. And, for the launchers, the
// dispatch from an Element to the kernel instantiation of its C++ type.
#pragma once

#include <cuda_bf16.h>

#include "kernels/cuda/element_type.h"

namespace lazykv::cuda {

__device__ __forceinline__ float ToFloat(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float ToFloat(float v) { return v; }

template <typename T>
__device__ __forceinline__ T FromFloat(float v);
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) {
  return __float2bfloat16(v);
}
template <>
__device__ __forceinline__ float FromFloat<float>(float v) {
  return v;
}

// Calls launch(T{}) with T the C++ type of `element` (float or __nv_bfloat16): host code, e.g.
// WithElementType(e, [&](auto t) { Kernel<decltype(t)><<<...>>>(p); }).
template <typename Launch>
void WithElementType(Element element, Launch&& launch) {
  if (element == Element::kFp32) {
    launch(float{});
  } else {
    launch(__nv_bfloat16{});
  }
}

}  // namespace lazykv::cuda
