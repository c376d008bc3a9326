// The skinny GEMM kernel's loads (skinny_gemm.cu): how W is streamed, how X is read (bf16 as
// it is, fp32 rounded to bf16, or fp32 RMS-normed with a gain), and the epilogues. Included
// only by skinny_gemm.cu.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace lazykv::cuda::skinny {

enum class Epilogue { kStore, kSwiGlu };
// How X is read: kAsIs as LoadX reads it (bf16, or fp32 rounded to bf16), kNormed RMS-normed
// (fp32, with a gain: LoadNormedX and the epilogue's scale).
enum class XLoad { kAsIs, kNormed };

// The RMSNorm's gain and epsilon, for XLoad::kNormed.
struct Norm {
  const float* gain = nullptr;
  float eps = 0.0f;
};

// W's rows are streamed once: loaded past L1 (no reuse).
__device__ inline uint4 LoadStreaming(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// The 8 values of X at vector `v` of its row `r`, as bf16.
__device__ inline uint4 LoadX(const __nv_bfloat16* x, int vectors, int r, int v) {
  return __ldg(reinterpret_cast<const uint4*>(x) + static_cast<size_t>(r) * vectors + v);
}
__device__ inline uint4 LoadX(const float* x, int vectors, int r, int v) {
  const float4* p = reinterpret_cast<const float4*>(x) + (static_cast<size_t>(r) * vectors + v) * 2;
  const float4 a = __ldg(p), b = __ldg(p + 1);
  uint4 out;
  __nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(&out);
  o[0] = __floats2bfloat162_rn(a.x, a.y);
  o[1] = __floats2bfloat162_rn(a.z, a.w);
  o[2] = __floats2bfloat162_rn(b.x, b.y);
  o[3] = __floats2bfloat162_rn(b.z, b.w);
  return out;
}

// The 8 values at vector `v` of fp32 row `r` of X times the gain, rounded to bf16; adds their
// squares (before the gain) to *squares.
__device__ inline uint4 LoadNormedX(const float* x, const float4 (&gain)[2], int vectors, int r, int v,
                                    float* squares) {
  const float4* p = reinterpret_cast<const float4*>(x) + (static_cast<size_t>(r) * vectors + v) * 2;
  const float4 a = __ldg(p), b = __ldg(p + 1);
  float ss = *squares;
  ss = fmaf(a.x, a.x, ss);
  ss = fmaf(a.y, a.y, ss);
  ss = fmaf(a.z, a.z, ss);
  ss = fmaf(a.w, a.w, ss);
  ss = fmaf(b.x, b.x, ss);
  ss = fmaf(b.y, b.y, ss);
  ss = fmaf(b.z, b.z, ss);
  ss = fmaf(b.w, b.w, ss);
  *squares = ss;
  uint4 out;
  __nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(&out);
  o[0] = __floats2bfloat162_rn(gain[0].x * a.x, gain[0].y * a.y);
  o[1] = __floats2bfloat162_rn(gain[0].z * a.z, gain[0].w * a.w);
  o[2] = __floats2bfloat162_rn(gain[1].x * b.x, gain[1].y * b.y);
  o[3] = __floats2bfloat162_rn(gain[1].z * b.z, gain[1].w * b.w);
  return out;
}

}  // namespace lazykv::cuda::skinny
