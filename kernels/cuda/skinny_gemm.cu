// Warps take rows of W in groups (grid-stride over W's rows). Each lane reads 8 bf16 of a row
// per 16-byte load, several in flight, and the same 8 values of each row of X (read-only
// path: every warp reads the same X, which stays in L1/L2). The dot products are reduced
// across the warp with shuffles, and one lane writes each element of Y.
#include <cstdint>

#include "kernels/cuda/skinny_gemm.h"

namespace lazykv::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kUnroll = 2;  // steps of kWRows loads each in flight per lane
constexpr int kWRows = 4;   // rows of W per warp

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

// W's rows are streamed once: loaded past L1 (no reuse).
__device__ inline uint4 LoadStreaming(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// A warp takes kWRows rows of W at a time: each step, every lane loads one 16-byte vector of
// each of them and the matching vector of each row of X once, so X's loads are shared by the
// kWRows rows (with one row of W per warp, X's loads outnumbered W's at 8 rows of X).
template <int kRows>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    SkinnyGemmKernel(const __nv_bfloat16* __restrict__ x, int in, const __nv_bfloat16* __restrict__ w, int out,
                     float* __restrict__ y, float beta) {
  const int lane = threadIdx.x % 32;
  const int warps = gridDim.x * kWarpsPerBlock;
  const int vectors = in / 8;  // 16-byte vectors per row
  const uint4* xv = reinterpret_cast<const uint4*>(x);
  for (int first = (blockIdx.x * kWarpsPerBlock + threadIdx.x / 32) * kWRows; first < out; first += warps * kWRows) {
    // Rows past `out` repeat the last row (loaded, never written).
    const uint4* wv[kWRows];
#pragma unroll
    for (int j = 0; j < kWRows; ++j) {
      const int row = first + j < out ? first + j : out - 1;
      wv[j] = reinterpret_cast<const uint4*>(w) + static_cast<size_t>(row) * vectors;
    }
    float acc[kWRows][kRows];
#pragma unroll
    for (int j = 0; j < kWRows; ++j) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) acc[j][r] = 0.0f;
    }
    for (int v = lane; v < vectors; v += 32 * kUnroll) {
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
#pragma unroll
          for (int r = 0; r < kRows; ++r) {
            const uint4 xr = __ldg(xv + static_cast<size_t>(r) * vectors + v + 32 * u);
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
#pragma unroll
    for (int j = 0; j < kWRows; ++j) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (lane == (j * kRows + r) % 32 && first + j < out) {
          float* out_y = y + static_cast<size_t>(r) * out + first + j;
          *out_y = beta == 0.0f ? acc[j][r] : acc[j][r] + beta * *out_y;
        }
      }
    }
  }
}

template <int kRows>
void Launch(const __nv_bfloat16* x, int in, const __nv_bfloat16* w, int out, float* y, float beta,
            cudaStream_t stream) {
  int device = 0, sms = 132;
  if (cudaGetDevice(&device) == cudaSuccess) cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  // Small blocks, so that a 4096-row W still spreads over every SM; at most 16 per SM
  // (enough loads in flight), and no more than W's rows need.
  const int wanted = (out + kWarpsPerBlock * kWRows - 1) / (kWarpsPerBlock * kWRows);
  const int grid = wanted < sms * 16 ? wanted : sms * 16;
  SkinnyGemmKernel<kRows><<<grid, kWarpsPerBlock * 32, 0, stream>>>(x, in, w, out, y, beta);
}

}  // namespace

bool SkinnyGemmApplies(const __nv_bfloat16* x, int rows, int in, const __nv_bfloat16* w) {
  return rows >= 1 && rows <= kSkinnyGemmMaxRows && in > 0 && in % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(w) % 16 == 0;
}

cudaError_t LaunchSkinnyGemm(const __nv_bfloat16* x, int rows, int in, const __nv_bfloat16* w, int out, float* y,
                             float beta, cudaStream_t stream) {
  if (!SkinnyGemmApplies(x, rows, in, w) || out <= 0 || y == nullptr) return cudaErrorInvalidValue;
  switch (rows) {
    case 1:
      Launch<1>(x, in, w, out, y, beta, stream);
      break;
    case 2:
      Launch<2>(x, in, w, out, y, beta, stream);
      break;
    case 3:
      Launch<3>(x, in, w, out, y, beta, stream);
      break;
    case 4:
      Launch<4>(x, in, w, out, y, beta, stream);
      break;
    case 5:
      Launch<5>(x, in, w, out, y, beta, stream);
      break;
    case 6:
      Launch<6>(x, in, w, out, y, beta, stream);
      break;
    case 7:
      Launch<7>(x, in, w, out, y, beta, stream);
      break;
    default:
      Launch<8>(x, in, w, out, y, beta, stream);
      break;
  }
  return cudaGetLastError();
}

}  // namespace lazykv::cuda
