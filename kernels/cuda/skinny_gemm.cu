// Warps take rows of W in groups of four (grid-stride over the groups). Each lane reads 8 bf16
// of a row per 16-byte load, several in flight, and the same 8 values of each row of X once
// for the group (read-only path: every warp reads the same X, which stays in L1/L2; with one
// row of W per warp, X's loads outnumbered W's at 8 rows of X). The dot products are reduced
// across the warp with shuffles, and one lane writes each element of the output.
//
// Fusions for a decode step. Bit for bit what the unfused kernels give: X in fp32, rounded to
// bf16 as it is loaded (the attention output, which LaunchToBf16 would round the same way),
// and SwiGLU applied to the gate and up products of W = [gate; up], written in bf16 (what
// LaunchSwiGlu computes from them, with the same expression). Not bit for bit: the RMSNorm of
// fp32 X (the residual stream) in the loads: each lane rounds gain * x to bf16 and adds up x^2
// as it goes, the warp reduces the squares with the products, and the epilogue scales each
// product by its row's rsqrt(mean(x^2) + eps). Every warp reads all of X anyway, so the norm
// costs no extra pass, and the norm kernel between two GEMMs (and its launch) leaves the step.
#include <cstdint>
#include <type_traits>

#include "common/env_switch.h"
#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/skinny_gemm.h"

namespace lazykv::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kUnroll = 2;  // steps of kWRows loads each in flight per lane
constexpr int kWRows = 4;   // rows of W per warp

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

__device__ inline void Accumulate(const uint4& wv, const uint4& xv, float& acc) {
  const __nv_bfloat162* w2 = reinterpret_cast<const __nv_bfloat162*>(&wv);
  const __nv_bfloat162* x2 = reinterpret_cast<const __nv_bfloat162*>(&xv);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 wf = __bfloat1622float2(w2[i]);
    const float2 xf = __bfloat1622float2(x2[i]);
    acc = fmaf(wf.x, xf.x, acc);
    acc = fmaf(wf.y, xf.y, acc);
  }
}

// kStore: a group is 4 consecutive rows of W (outputs first..first+3 of `out`). kSwiGlu: W is
// [gate; up] with `out` rows each, and a group is gate rows c, c+1 and up rows c, c+1
// (outputs c and c+1 of h).
// kNormed: XT is float, and `gain` and `eps` are the RMSNorm's.
// kKSplit 1: each warp takes whole groups. kKSplit kWarpsPerBlock: the CTA's warps take one
// group together, every fourth step of K each, add the parts' sums in warp order, and warp 0
// writes (more loads in flight where W has few rows: SkinnyKSplit).
template <int kRows, typename XT, Epilogue kEpilogue, XLoad kX, int kKSplit>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    SkinnyGemmKernel(const XT* __restrict__ x, int in, const __nv_bfloat16* __restrict__ w, int out,
                     float* __restrict__ y, float beta, __nv_bfloat16* __restrict__ h, const float* __restrict__ gain,
                     float eps) {
  static_assert(kX == XLoad::kAsIs || std::is_same_v<XT, float>, "the norm reads fp32 X");
  static_assert(kKSplit == 1 || kKSplit == kWarpsPerBlock, "whole groups a warp, or a group a CTA");
  constexpr int kCols = kEpilogue == Epilogue::kStore ? kWRows : kWRows / 2;  // outputs per group
  constexpr int kGroupsPerBlock = kWarpsPerBlock / kKSplit;
  // No AllowDependentLaunch: a successor's CTAs waiting beside this memory-bound kernel cost
  // it ~10% (they poll); they are launched when it ends. (That also orders a layer's prefill
  // launch behind the last one's work starts: dependent_launch.cuh.)
  WaitForPriorGrid();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int part = warp % kKSplit;  // which part of K this warp takes
  const int group_stride = gridDim.x * kGroupsPerBlock;
  const int vectors = in / 8;  // 16-byte vectors per row
  // This warp's vectors of each row: steps of 32 * kUnroll, every kKSplit-th from its part's
  // (the CTA's warps read neighbouring kilobytes of a row together).
  for (int first = (blockIdx.x * kGroupsPerBlock + warp / kKSplit) * kCols; first < out;
       first += group_stride * kCols) {
    // Outputs past `out` repeat the last one (loaded, never written).
    const uint4* wv[kWRows];
#pragma unroll
    for (int j = 0; j < kWRows; ++j) {
      const int col = first + j % kCols < out ? first + j % kCols : out - 1;
      const int row = kEpilogue == Epilogue::kStore ? col : col + (j < kCols ? 0 : out);
      wv[j] = reinterpret_cast<const uint4*>(w) + static_cast<size_t>(row) * vectors;
    }
    float acc[kWRows][kRows];
    float squares[kRows];  // kNormed: this lane's part of each row's sum of x^2
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      squares[r] = 0.0f;
#pragma unroll
      for (int j = 0; j < kWRows; ++j) acc[j][r] = 0.0f;
    }
    for (int v = part * 32 * kUnroll + lane; v < vectors; v += 32 * kUnroll * kKSplit) {
      uint4 wr[kUnroll][kWRows];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (v + 32 * u < vectors) {
#pragma unroll
          for (int j = 0; j < kWRows; ++j) wr[u][j] = LoadStreaming(wv[j] + v + 32 * u);
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (v + 32 * u < vectors) {
          [[maybe_unused]] float4 g[2];
          if constexpr (kX == XLoad::kNormed) {
            g[0] = __ldg(reinterpret_cast<const float4*>(gain) + 2 * (v + 32 * u));
            g[1] = __ldg(reinterpret_cast<const float4*>(gain) + 2 * (v + 32 * u) + 1);
          }
#pragma unroll
          for (int r = 0; r < kRows; ++r) {
            uint4 xr;
            if constexpr (kX == XLoad::kNormed) {
              xr = LoadNormedX(x, g, vectors, r, v + 32 * u, &squares[r]);
            } else {
              xr = LoadX(x, vectors, r, v + 32 * u);
            }
#pragma unroll
            for (int j = 0; j < kWRows; ++j) Accumulate(wr[u][j], xr, acc[j][r]);
          }
        }
      }
    }
#pragma unroll
    for (int j = 0; j < kWRows; ++j) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
#pragma unroll
        for (int offset = 16; offset > 0; offset /= 2) acc[j][r] += __shfl_xor_sync(0xFFFFFFFFu, acc[j][r], offset);
      }
    }
    if constexpr (kX == XLoad::kNormed) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
#pragma unroll
        for (int offset = 16; offset > 0; offset /= 2) squares[r] += __shfl_xor_sync(0xFFFFFFFFu, squares[r], offset);
      }
    }
    if constexpr (kKSplit > 1) {  // the parts' sums, added by warp 0 in warp order
      __shared__ float part_acc[kKSplit][kWRows][kRows];
      __shared__ float part_squares[kKSplit][kRows];
      if (lane == 0) {
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          part_squares[part][r] = squares[r];
#pragma unroll
          for (int j = 0; j < kWRows; ++j) part_acc[part][j][r] = acc[j][r];
        }
      }
      __syncthreads();
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        squares[r] = part_squares[0][r];
#pragma unroll
        for (int q = 1; q < kKSplit; ++q) squares[r] += part_squares[q][r];
#pragma unroll
        for (int j = 0; j < kWRows; ++j) {
          acc[j][r] = part_acc[0][j][r];
#pragma unroll
          for (int q = 1; q < kKSplit; ++q) acc[j][r] += part_acc[q][j][r];
        }
      }
      __syncthreads();  // part_acc is written again by the next group
    }
    if (part != 0) continue;               // warp 0 of the group writes
    if constexpr (kX == XLoad::kNormed) {  // the norm's scale, as the norm kernel computes it
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const float scale = rsqrtf(squares[r] / in + eps);
#pragma unroll
        for (int j = 0; j < kWRows; ++j) acc[j][r] *= scale;
      }
    }
#pragma unroll
    for (int j = 0; j < kCols; ++j) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (lane == (j * kRows + r) % 32 && first + j < out) {
          if constexpr (kEpilogue == Epilogue::kStore) {
            float* out_y = y + static_cast<size_t>(r) * out + first + j;
            *out_y = beta == 0.0f ? acc[j][r] : acc[j][r] + beta * *out_y;
          } else {
            const float g = acc[j][r], u = acc[j + kCols][r];
            h[static_cast<size_t>(r) * out + first + j] = __float2bfloat16(g / (1.0f + expf(-g)) * u);
          }
        }
      }
    }
  }
}

// Whether a product of `out` outputs (kCols a group) splits K over a CTA's warps: where W has
// fewer groups than 16 warps an SM (Llama-3-8B's QKV, output and down projections: 1024-1536
// groups), one warp a group leaves too few loads in flight to stream W at the memory's rate.
// Decided by the shape alone, so that a fused kernel and the unfused one it replaces sum in the
// same order. LAZYKV_SKINNY_K_SPLIT=0: never, for comparisons.
bool SkinnyKSplit(int out, int cols) {
  static const bool enabled = EnvSwitchOn("LAZYKV_SKINNY_K_SPLIT");
  return enabled && (out + cols - 1) / cols < 16 * MultiprocessorCount();
}

template <int kRows, typename XT, Epilogue kEpilogue, XLoad kX>
cudaError_t Launch(const XT* x, int in, const __nv_bfloat16* w, int out, float* y, float beta, __nv_bfloat16* h,
                   Norm norm, cudaStream_t stream) {
  const int sms = MultiprocessorCount();  // cached per device: some hundred launches a step
  constexpr int kCols = kEpilogue == Epilogue::kStore ? kWRows : kWRows / 2;
  const int groups = (out + kCols - 1) / kCols;
  if (SkinnyKSplit(out, kCols)) {  // a CTA a group
    return LaunchDependent(SkinnyGemmKernel<kRows, XT, kEpilogue, kX, kWarpsPerBlock>, groups, kWarpsPerBlock * 32, 0,
                           stream, x, in, w, out, y, beta, h, norm.gain, norm.eps);
  }
  // Small blocks, so that a 4096-row W still spreads over every SM; at most 16 per SM
  // (enough loads in flight), and no more than W's rows need.
  const int wanted = (groups + kWarpsPerBlock - 1) / kWarpsPerBlock;
  const int grid = wanted < sms * 16 ? wanted : sms * 16;
  return LaunchDependent(SkinnyGemmKernel<kRows, XT, kEpilogue, kX, 1>, grid, kWarpsPerBlock * 32, 0, stream, x, in, w,
                         out, y, beta, h, norm.gain, norm.eps);
}

template <typename XT, Epilogue kEpilogue, XLoad kX = XLoad::kAsIs>
cudaError_t Dispatch(int rows, const XT* x, int in, const __nv_bfloat16* w, int out, float* y, float beta,
                     __nv_bfloat16* h, cudaStream_t stream, Norm norm = {}) {
  switch (rows) {
    case 1:
      return Launch<1, XT, kEpilogue, kX>(x, in, w, out, y, beta, h, norm, stream);
    case 2:
      return Launch<2, XT, kEpilogue, kX>(x, in, w, out, y, beta, h, norm, stream);
    case 3:
      return Launch<3, XT, kEpilogue, kX>(x, in, w, out, y, beta, h, norm, stream);
    case 4:
      return Launch<4, XT, kEpilogue, kX>(x, in, w, out, y, beta, h, norm, stream);
    case 5:
      return Launch<5, XT, kEpilogue, kX>(x, in, w, out, y, beta, h, norm, stream);
    case 6:
      return Launch<6, XT, kEpilogue, kX>(x, in, w, out, y, beta, h, norm, stream);
    case 7:
      return Launch<7, XT, kEpilogue, kX>(x, in, w, out, y, beta, h, norm, stream);
    default:
      return Launch<8, XT, kEpilogue, kX>(x, in, w, out, y, beta, h, norm, stream);
  }
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool SkinnyGemmApplies(const void* x, int rows, int in, const __nv_bfloat16* w) {
  return rows >= 1 && rows <= kSkinnyGemmMaxRows && in > 0 && in % 8 == 0 && Aligned16(x) && Aligned16(w);
}

bool SkinnyNormApplies(const float* x, const float* gain, int rows, int in, const __nv_bfloat16* w) {
  return SkinnyGemmApplies(x, rows, in, w) && Aligned16(gain);
}

cudaError_t LaunchSkinnyGemm(const __nv_bfloat16* x, int rows, int in, const __nv_bfloat16* w, int out, float* y,
                             float beta, cudaStream_t stream) {
  if (!SkinnyGemmApplies(x, rows, in, w) || out <= 0 || y == nullptr) return cudaErrorInvalidValue;
  return Dispatch<__nv_bfloat16, Epilogue::kStore>(rows, x, in, w, out, y, beta, nullptr, stream);
}

cudaError_t LaunchSkinnyGemmRoundingX(const float* x, int rows, int in, const __nv_bfloat16* w, int out, float* y,
                                      float beta, cudaStream_t stream) {
  if (!SkinnyGemmApplies(x, rows, in, w) || out <= 0 || y == nullptr) return cudaErrorInvalidValue;
  return Dispatch<float, Epilogue::kStore>(rows, x, in, w, out, y, beta, nullptr, stream);
}

cudaError_t LaunchSkinnyGemmNormingX(const float* x, const float* gain, float eps, int rows, int in,
                                     const __nv_bfloat16* w, int out, float* y, cudaStream_t stream) {
  if (!SkinnyNormApplies(x, gain, rows, in, w) || out <= 0 || y == nullptr) return cudaErrorInvalidValue;
  return Dispatch<float, Epilogue::kStore, XLoad::kNormed>(rows, x, in, w, out, y, 0.0f, nullptr, stream,
                                                           Norm{gain, eps});
}

cudaError_t LaunchSkinnyGateUpSwiGlu(const __nv_bfloat16* x, int rows, int in, const __nv_bfloat16* w_gate_up,
                                     int hidden, __nv_bfloat16* h, cudaStream_t stream) {
  if (!SkinnyGemmApplies(x, rows, in, w_gate_up) || hidden <= 0 || h == nullptr) return cudaErrorInvalidValue;
  return Dispatch<__nv_bfloat16, Epilogue::kSwiGlu>(rows, x, in, w_gate_up, hidden, nullptr, 0.0f, h, stream);
}

cudaError_t LaunchSkinnyGateUpSwiGluNormingX(const float* x, const float* gain, float eps, int rows, int in,
                                             const __nv_bfloat16* w_gate_up, int hidden, __nv_bfloat16* h,
                                             cudaStream_t stream) {
  if (!SkinnyNormApplies(x, gain, rows, in, w_gate_up) || hidden <= 0 || h == nullptr) {
    return cudaErrorInvalidValue;
  }
  return Dispatch<float, Epilogue::kSwiGlu, XLoad::kNormed>(rows, x, in, w_gate_up, hidden, nullptr, 0.0f, h, stream,
                                                            Norm{gain, eps});
}

}  // namespace lazykv::cuda
