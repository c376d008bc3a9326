// A CTA of 4 warps takes a tile of 64 rows of W (warp w its rows 16w..16w+15) and a part of
// K, in stages of 64 columns: per stage, 64 x 64 of W and up to 64 x 64 of X go to shared
// memory by cp.async (four stages in flight, three at 33-64 rows: 48 KB of static shared memory
// at most), each warp loads its A fragments (W) and the B fragments (X, rows as the MMA's N)
// and runs mma.sync m16n8k16 into fp32 accumulators: one, two, four or eight 8-row tiles of X
// (up to 8, 16, 32 or 64 rows; fp32 X up to 16).
//
// Shared memory rows of W and bf16 X are 128 bytes (8 chunks of 16): chunk c of row r sits at
// c ^ (r % 8), so the eight rows ldmatrix reads at one chunk fall in eight different bank
// groups. fp32 X (rounded to bf16 as the fragments are built, as LaunchToBf16 rounds it) has
// 256-byte rows of 16 chunks, swizzled the same way.
//
// Epilogues: kStore writes y (beta 0) or adds to it (beta 1). kSwiGlu takes W = [gate; up]
// (`hidden` rows each): a tile is gate rows c0..c0+31 (warps 0-1) and up rows c0..c0+31
// (warps 2-3), and h = SwiGLU(gate, up) is written in bf16 with LaunchSwiGlu's expression.
// Each element's sum is the one the kStore kernel forms over the same rows (same stages, same
// split: the split count follows the tile count, equal for [gate; up] in tiles of 64 and in
// pairs of 32), so the fused kernels equal the unfused ones bit for bit.
//
// Split K (SkinnyMmaSplits): part p of `splits` takes stages [p * T / splits, (p + 1) * T /
// splits) of the T stages, writes its sums to the workspace ([part][rows][columns of the
// product]), and counts itself in on its tile's counter; the part that completes the count
// adds the parts' sums in part order, applies the epilogue and sets the counter back to zero
// (as the decode kernel's last split merges: last_split_merge.cuh).
#include <algorithm>
#include <climits>
#include <cstdint>
#include <type_traits>

#include "common/env_switch.h"
#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/skinny_mma_gemm.h"
#include "kernels/cuda/skinny_mma_stages.cuh"

namespace lazykv::cuda {
namespace {

using bf16 = __nv_bfloat16;
using async_copy::CpAsyncCommit;
using async_copy::CpAsyncWait;
using skinny_mma::Epilogue;
using skinny_mma::kStageK;
using skinny_mma::kStages;
using skinny_mma::kThreads;
using skinny_mma::LoadW;
using skinny_mma::LoadX;
using skinny_mma::MultiplyStage;
using skinny_mma::Stages;

constexpr int kMinStagesPerPart = 4;  // a part shorter than the pipeline wastes its fill
constexpr int kCtasPerSm = 4;         // CTAs resident an SM (4-5 fit in shared memory)

// The product's column (of y, or of [gate; up] for kSwiGlu) that tile row m holds.
template <Epilogue kEpilogue>
__device__ __forceinline__ int ProductColumn(int tile0, int m, int out) {
  if constexpr (kEpilogue == Epilogue::kStore) {
    return tile0 + m;
  } else {
    return tile0 + m % 32 + (m < 32 ? 0 : out);
  }
}

// out: y's columns (kStore) or `hidden` (kSwiGlu, whose product has 2 * hidden columns).
template <int kNTiles, typename XT, Epilogue kEpilogue>
__global__ void __launch_bounds__(kThreads)
    SkinnyMmaGemmKernel(const XT* __restrict__ x, int rows, int in, const bf16* __restrict__ w, int out,
                        float* __restrict__ y, float beta, bf16* __restrict__ h, float* __restrict__ workspace,
                        int32_t* __restrict__ counters) {
  __shared__ Stages<kNTiles, XT> sm;
  constexpr int kStagesInFlight = kStages<kNTiles, XT>;
  constexpr int kTileCols = kEpilogue == Epilogue::kStore ? kSkinnyMmaTileOut : kSkinnyMmaTileOut / 2;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int tile0 = blockIdx.x * kTileCols;
  const int splits = gridDim.y, part = blockIdx.y;
  const int total = (in + kStageK - 1) / kStageK;
  const int first = static_cast<int>(static_cast<int64_t>(part) * total / splits);
  const int stages = static_cast<int>(static_cast<int64_t>(part + 1) * total / splits) - first;
  const int product_cols = kEpilogue == Epilogue::kStore ? out : 2 * out;

  // W (weights: no kernel before this one writes them) is in flight before the wait for the
  // kernel that writes X. No AllowDependentLaunch (as the CUDA-core skinny kernel): the successor
  // starts as this ends, which also orders a layer's prefill launch behind the last one's work
  // starts (dependent_launch.cuh).
#pragma unroll
  for (int s = 0; s < kStagesInFlight - 1; ++s) {
    if (s < stages) LoadW<kEpilogue>(sm, s, w, in, out, tile0, (first + s) * kStageK);
  }
  WaitForPriorGrid();
#pragma unroll
  for (int s = 0; s < kStagesInFlight - 1; ++s) {
    if (s < stages) LoadX(sm, s, x, rows, in, (first + s) * kStageK);
    CpAsyncCommit();
  }

  float acc[kNTiles][4] = {};
  for (int it = 0; it < stages; ++it) {
    CpAsyncWait<kStagesInFlight - 2>();  // stage `it` has landed (this thread's copies)
    __syncthreads();                     // everyone's, and the buffer refilled below is read by no one
    const int next = it + kStagesInFlight - 1;
    if (next < stages) {
      LoadW<kEpilogue>(sm, next % kStagesInFlight, w, in, out, tile0, (first + next) * kStageK);
      LoadX(sm, next % kStagesInFlight, x, rows, in, (first + next) * kStageK);
    }
    CpAsyncCommit();
    MultiplyStage(sm, it % kStagesInFlight, warp, lane, acc);
  }
  // Every copy has landed (those after the last stage's were empty groups); from here the
  // stage buffers hold the split's flag and the SwiGLU exchange, once every warp is past its
  // last stage (a plain store of an unsplit product uses neither).
  if (kEpilogue == Epilogue::kSwiGlu || splits > 1) __syncthreads();

  // acc[nt][i] is the sum of tile row m = 16 * warp + lane / 4 + 8 * (i / 2) and X row
  // 8 * nt + 2 * (lane % 4) + i % 2.
  const int m_base = 16 * warp + lane / 4, row_base = 2 * (lane % 4);
  // The tile's sums, [64 tile rows][8 * kNTiles X rows] in rows of one more (no bank
  // conflicts along either index), where the epilogue reads them.
  constexpr int kTileSumsStride = 8 * kNTiles + 1;
  static_assert(kSkinnyMmaTileOut * kTileSumsStride * sizeof(float) <= sizeof(sm.w), "in the W stages");
  float* tile_sums = reinterpret_cast<float*>(&sm.w[0][0]);
  if (splits == 1) {
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int m = m_base + 8 * (i / 2), r = 8 * nt + row_base + i % 2;
        if constexpr (kEpilogue == Epilogue::kStore) {
          const int col = tile0 + m;
          if (col < out && r < rows) {
            float* o = y + static_cast<size_t>(r) * out + col;
            *o = beta == 0.0f ? acc[nt][i] : acc[nt][i] + beta * *o;
          }
        } else {
          tile_sums[m * kTileSumsStride + r] = acc[nt][i];
        }
      }
    }
    if constexpr (kEpilogue == Epilogue::kStore) return;
  } else {
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int m = m_base + 8 * (i / 2), r = 8 * nt + row_base + i % 2;
        if (tile0 + m % kTileCols < out && r < rows) {
          workspace[(static_cast<size_t>(part) * rows + r) * product_cols + ProductColumn<kEpilogue>(tile0, m, out)] =
              acc[nt][i];
        }
      }
    }
    // Release and acquire by one thread: the barrier orders the CTA's stores before thread 0's
    // fence, which is cumulative (as last_split_merge.cuh and CUTLASS's split-K semaphore do it).
    int* last_part = reinterpret_cast<int*>(&sm.x[0][0]);
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      *last_part = atomicAdd(&counters[blockIdx.x], 1) == splits - 1;
      if (*last_part) {
        atomicExch(&counters[blockIdx.x], 0);  // every part has counted in: zero for the next launch
        __threadfence();                       // the other parts' sums are read after their counts
      }
    }
    __syncthreads();
    if (!*last_part) return;
    // The parts' sums in part order. A thread's elements (at most kElems) are summed together,
    // each part's loads for all of them in flight at once: a round trip to L2 a part, not one
    // an element and part (the tail of every split launch, longer with every row).
    constexpr int kElems = 8 * kNTiles * kSkinnyMmaTileOut / kThreads;  // rows <= 8 * kNTiles (Launch)
    const size_t part_stride = static_cast<size_t>(rows) * product_cols;
    int offset[kElems];  // of the element in part 0's sums; -1: past the product
    float sum[kElems];
#pragma unroll
    for (int i = 0; i < kElems; ++i) {
      const int e = threadIdx.x + i * kThreads, r = e / kSkinnyMmaTileOut, m = e % kSkinnyMmaTileOut;
      offset[i] =
          r < rows && tile0 + m % kTileCols < out ? r * product_cols + ProductColumn<kEpilogue>(tile0, m, out) : -1;
      sum[i] = offset[i] < 0 ? 0.0f : __ldcg(workspace + offset[i]);
    }
    for (int q = 1; q < splits; ++q) {
      const float* part_sums = workspace + q * part_stride;
      float more[kElems];
#pragma unroll
      for (int i = 0; i < kElems; ++i) more[i] = offset[i] < 0 ? 0.0f : __ldcg(part_sums + offset[i]);
#pragma unroll
      for (int i = 0; i < kElems; ++i) sum[i] += more[i];
    }
    if constexpr (kEpilogue == Epilogue::kStore) {
      if (beta != 0.0f) {  // y's values, likewise all in flight
        float prior[kElems];
#pragma unroll
        for (int i = 0; i < kElems; ++i) prior[i] = offset[i] < 0 ? 0.0f : y[offset[i]];
#pragma unroll
        for (int i = 0; i < kElems; ++i) sum[i] += beta * prior[i];
      }
#pragma unroll
      for (int i = 0; i < kElems; ++i) {
        if (offset[i] >= 0) y[offset[i]] = sum[i];
      }
    } else {
#pragma unroll
      for (int i = 0; i < kElems; ++i) {
        const int e = threadIdx.x + i * kThreads, r = e / kSkinnyMmaTileOut, m = e % kSkinnyMmaTileOut;
        if (offset[i] >= 0) tile_sums[m * kTileSumsStride + r] = sum[i];
      }
    }
    if constexpr (kEpilogue == Epilogue::kStore) return;
  }
  if constexpr (kEpilogue == Epilogue::kSwiGlu) {  // gate in tile rows 0-31, up in 32-63
    __syncthreads();
    for (int e = threadIdx.x; e < rows * 32; e += kThreads) {
      const int r = e / 32, c = e % 32;
      if (tile0 + c >= out) continue;
      const float g = tile_sums[c * kTileSumsStride + r], u = tile_sums[(32 + c) * kTileSumsStride + r];
      h[static_cast<size_t>(r) * out + tile0 + c] = __float2bfloat16(g / (1.0f + expf(-g)) * u);
    }
  }
}

int Tiles(int product_cols) { return (product_cols + kSkinnyMmaTileOut - 1) / kSkinnyMmaTileOut; }
int TotalStages(int in) { return (in + kStageK - 1) / kStageK; }

// (The last part's tail indexes a part's sums in int: at most INT_MAX of them.)
bool ScratchHolds(int splits, int rows, int product_cols, const SkinnyMmaScratch& scratch) {
  return scratch.workspace != nullptr && scratch.counters != nullptr && Tiles(product_cols) <= scratch.counter_slots &&
         static_cast<size_t>(rows) * product_cols <= INT_MAX &&
         static_cast<size_t>(splits) * rows * product_cols * sizeof(float) <= scratch.workspace_bytes;
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The launch of any variant: `out` as the kernel takes it, `product_cols` the product's
// columns (out, or 2 * hidden).
template <typename XT, Epilogue kEpilogue>
cudaError_t Launch(const XT* x, int rows, int in, const bf16* w, int out, int product_cols, float* y, float beta,
                   bf16* h, const SkinnyMmaScratch& scratch, cudaStream_t stream, int splits) {
  if (splits == 0) {
    const bool after_attention = std::is_same_v<XT, float>;  // fp32 X: the output projection
    splits = SkinnyMmaSplits(rows, in, product_cols, scratch,
                             after_attention ? kSkinnyMmaSplitCapAfterAttention : kSkinnyMmaSplitCap);
  } else if (splits < 1 || splits > TotalStages(in) || splits > 65535 ||
             (splits > 1 && !ScratchHolds(splits, rows, product_cols, scratch))) {
    return cudaErrorInvalidValue;
  }
  const dim3 grid(Tiles(product_cols), splits);
  if (rows <= 8) {
    return LaunchDependent(SkinnyMmaGemmKernel<1, XT, kEpilogue>, grid, dim3(kThreads), 0, stream, x, rows, in, w, out,
                           y, beta, h, scratch.workspace, scratch.counters);
  }
  if constexpr (std::is_same_v<XT, bf16>) {
    if (rows > 32) {
      return LaunchDependent(SkinnyMmaGemmKernel<8, XT, kEpilogue>, grid, dim3(kThreads), 0, stream, x, rows, in, w,
                             out, y, beta, h, scratch.workspace, scratch.counters);
    }
    if (rows > 16) {
      return LaunchDependent(SkinnyMmaGemmKernel<4, XT, kEpilogue>, grid, dim3(kThreads), 0, stream, x, rows, in, w,
                             out, y, beta, h, scratch.workspace, scratch.counters);
    }
  }
  return LaunchDependent(SkinnyMmaGemmKernel<2, XT, kEpilogue>, grid, dim3(kThreads), 0, stream, x, rows, in, w, out, y,
                         beta, h, scratch.workspace, scratch.counters);
}

}  // namespace

bool SkinnyMmaGemmApplies(const void* x, int rows, int in, const __nv_bfloat16* w) {
  return rows >= kSkinnyMmaMinRows && rows <= kSkinnyMmaMaxRows && in > 0 && in % 8 == 0 && Aligned16(x) &&
         Aligned16(w);
}

int SkinnyMmaSplits(int rows, int in, int out, const SkinnyMmaScratch& scratch, int cap) {
  static const int forced = EnvCount("LAZYKV_SKINNY_MMA_SPLITS");
  static const int env_cap = EnvCount("LAZYKV_SKINNY_MMA_MAX_SPLITS");
  const int tiles = Tiles(out);
  int splits = forced > 0 ? forced : std::min(env_cap > 0 ? env_cap : cap, kCtasPerSm * MultiprocessorCount() / tiles);
  splits = std::clamp(splits, 1, std::max(1, TotalStages(in) / kMinStagesPerPart));
  return splits > 1 && ScratchHolds(splits, rows, out, scratch) ? splits : 1;
}

cudaError_t LaunchSkinnyMmaGemm(const __nv_bfloat16* x, int rows, int in, const __nv_bfloat16* w, int out, float* y,
                                float beta, const SkinnyMmaScratch& scratch, cudaStream_t stream, int splits) {
  if (!SkinnyMmaGemmApplies(x, rows, in, w) || out < 1 || y == nullptr || (beta != 0.0f && beta != 1.0f)) {
    return cudaErrorInvalidValue;
  }
  return Launch<bf16, Epilogue::kStore>(x, rows, in, w, out, out, y, beta, nullptr, scratch, stream, splits);
}

cudaError_t LaunchSkinnyMmaGemmRoundingX(const float* x, int rows, int in, const __nv_bfloat16* w, int out, float* y,
                                         float beta, const SkinnyMmaScratch& scratch, cudaStream_t stream, int splits) {
  if (!SkinnyMmaGemmApplies(x, rows, in, w) || rows > kSkinnyMmaRoundingMaxRows || out < 1 || y == nullptr ||
      (beta != 0.0f && beta != 1.0f)) {
    return cudaErrorInvalidValue;
  }
  return Launch<float, Epilogue::kStore>(x, rows, in, w, out, out, y, beta, nullptr, scratch, stream, splits);
}

cudaError_t LaunchSkinnyMmaGateUpSwiGlu(const __nv_bfloat16* x, int rows, int in, const __nv_bfloat16* w_gate_up,
                                        int hidden, __nv_bfloat16* h, const SkinnyMmaScratch& scratch,
                                        cudaStream_t stream, int splits) {
  if (!SkinnyMmaGemmApplies(x, rows, in, w_gate_up) || hidden < 1 || h == nullptr) return cudaErrorInvalidValue;
  return Launch<bf16, Epilogue::kSwiGlu>(x, rows, in, w_gate_up, hidden, 2 * hidden, nullptr, 0.0f, h, scratch, stream,
                                         splits);
}

}  // namespace lazykv::cuda
