// A CTA of 4 warps takes a tile of 64 rows of W (warp w its rows 16w..16w+15) and a part of
// K, in stages of 64 columns: per stage, 64 x 64 of W and up to 16 x 64 of X go to shared
// memory by cp.async (four stages in flight), each warp loads its A fragments (W) and the B
// fragments (X, rows as the MMA's N) with ldmatrix and runs mma.sync m16n8k16 into fp32
// accumulators: one or two 8-row tiles of X (5-8 rows: one).
//
// Shared memory rows are 128 bytes (8 chunks of 16): chunk c of row r sits at c ^ (r % 8), so
// the eight rows ldmatrix reads at one chunk fall in eight different bank groups.
//
// Split K (SkinnyMmaSplits): part p of `splits` takes stages [p * T / splits, (p + 1) * T /
// splits) of the T stages, writes its sums to the workspace, and counts itself in on its
// tile's counter; the part that completes the count adds the parts' sums in part order, adds
// y for beta 1, writes y and sets the counter back to zero (as the decode kernel's last split
// merges: last_split_merge.cuh).
#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/mma_sync.cuh"
#include "kernels/cuda/skinny_mma_gemm.h"

namespace lazykv::cuda {
namespace {

using bf16 = __nv_bfloat16;
using mma::Ldmatrix2;
using mma::Ldmatrix4;
using mma::Mma;
using mma::SmemAddr;

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kStageK = 64;           // columns of K a stage: 128 bytes of a row
constexpr int kChunks = kStageK / 8;  // 16-byte chunks of a row in a stage
constexpr int kStages = 4;            // stages in flight (36-40 KB of shared memory a CTA)
constexpr int kMaxSplits = 4;         // parts of K at most (chosen, not forced)
constexpr int kMinStagesPerPart = 4;  // a part shorter than the pipeline wastes its fill
constexpr int kCtasPerSm = 4;         // CTAs resident an SM (5 fit in shared memory)
constexpr int kWChunksPerThread = kSkinnyMmaTileOut * kChunks / kThreads;
static_assert(kSkinnyMmaTileOut == 16 * kWarps, "a warp takes 16 rows of W");
static_assert(kWChunksPerThread * kThreads == kSkinnyMmaTileOut * kChunks, "whole chunks a thread");

// The stages in shared memory: W [stage][64 rows x 8 chunks], X [stage][8 * kNTiles rows x 8].
template <int kNTiles>
struct Stages {
  uint4 w[kStages][kSkinnyMmaTileOut * kChunks];
  uint4 x[kStages][8 * kNTiles * kChunks];
};

__device__ __forceinline__ int Swizzled(int row, int chunk) { return row * kChunks + (chunk ^ (row & 7)); }

// 16 bytes global -> shared, src_bytes 0 fills zeros. W's copies also ask L2 for the
// 256 bytes around them: W is read once, and the next stage's columns of the row then come
// from L2 (256-byte reads of each row from memory, not 128).
__device__ __forceinline__ void CpAsyncStreamed(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(SmemAddr(dst)), "l"(src), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void CpAsync(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SmemAddr(dst)), "l"(src), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Stage `stage` of the tile's W (columns from k0) into buffer `buffer`. Rows past `out`
// repeat the last row (loaded, never written); columns past `in` are zeros.
template <int kNTiles>
__device__ __forceinline__ void LoadW(Stages<kNTiles>& sm, int buffer, const bf16* w, int in, int out, int tile0,
                                      int k0) {
#pragma unroll
  for (int j = 0; j < kWChunksPerThread; ++j) {
    const int i = threadIdx.x + j * kThreads;
    const int r = i / kChunks, c = i % kChunks;
    const int row = min(tile0 + r, out - 1);
    const int k = k0 + c * 8;
    const bool inside = k < in;
    CpAsyncStreamed(&sm.w[buffer][Swizzled(r, c)], w + static_cast<size_t>(row) * in + (inside ? k : 0),
                    inside ? 16 : 0);
  }
}

// The same stage of X: rows past `rows` and columns past `in` are zeros.
template <int kNTiles>
__device__ __forceinline__ void LoadX(Stages<kNTiles>& sm, int buffer, const bf16* x, int rows, int in, int k0) {
  const int i = threadIdx.x;
  if (i < 8 * kNTiles * kChunks) {
    const int r = i / kChunks, c = i % kChunks;
    const int k = k0 + c * 8;
    const bool inside = r < rows && k < in;
    CpAsync(&sm.x[buffer][Swizzled(r, c)], x + (inside ? static_cast<size_t>(r) * in + k : 0), inside ? 16 : 0);
  }
}

// The warp's 16 rows of W times the stage's X, added to acc[n-tile]: per 16 columns, one
// ldmatrix.x4 of W (the A fragment: rows 0-7 and 8-15, columns 0-7 and 8-15, from lanes
// 0-7, 8-15, 16-23, 24-31) and one of X (B fragments: rows 0-7 at columns 0-7 and 8-15, then
// rows 8-15 likewise; .x2 for one tile).
template <int kNTiles>
__device__ __forceinline__ void MultiplyStage(const Stages<kNTiles>& sm, int buffer, int warp, int lane,
                                              float (&acc)[kNTiles][4]) {
  const int a_row = 16 * warp + (lane & 7) + ((lane >> 3) & 1) * 8;
  const int b_row = (lane & 7) + (kNTiles == 2 ? (lane >> 4) * 8 : 0);
#pragma unroll
  for (int kk = 0; kk < kStageK / 16; ++kk) {
    uint32_t a[4];
    Ldmatrix4(a, &sm.w[buffer][Swizzled(a_row, 2 * kk + (lane >> 4))]);
    const uint4* b_chunk = &sm.x[buffer][Swizzled(b_row, 2 * kk + ((lane >> 3) & 1))];
    if constexpr (kNTiles == 2) {
      uint32_t b[4];
      Ldmatrix4(b, b_chunk);
      Mma(acc[0], a, b[0], b[1]);
      Mma(acc[1], a, b[2], b[3]);
    } else {
      uint32_t b[2];
      Ldmatrix2(b, b_chunk);
      Mma(acc[0], a, b[0], b[1]);
    }
  }
}

template <int kNTiles>
__global__ void __launch_bounds__(kThreads)
    SkinnyMmaGemmKernel(const bf16* __restrict__ x, int rows, int in, const bf16* __restrict__ w, int out,
                        float* __restrict__ y, float beta, float* __restrict__ workspace,
                        int32_t* __restrict__ counters) {
  __shared__ Stages<kNTiles> sm;
  __shared__ bool last_part;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int tile0 = blockIdx.x * kSkinnyMmaTileOut;
  const int splits = gridDim.y, part = blockIdx.y;
  const int total = (in + kStageK - 1) / kStageK;
  const int first = static_cast<int>(static_cast<int64_t>(part) * total / splits);
  const int stages = static_cast<int>(static_cast<int64_t>(part + 1) * total / splits) - first;

  // W (weights: no kernel before this one writes them) is in flight before the wait for the
  // kernel that writes X.
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < stages) LoadW(sm, s, w, in, out, tile0, (first + s) * kStageK);
  }
  WaitForPriorGrid();
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < stages) LoadX(sm, s, x, rows, in, (first + s) * kStageK);
    CpAsyncCommit();
  }

  float acc[kNTiles][4] = {};
  for (int it = 0; it < stages; ++it) {
    CpAsyncWait<kStages - 2>();  // stage `it` has landed (this thread's copies)
    __syncthreads();             // everyone's, and the buffer refilled below is read by no one
    const int next = it + kStages - 1;
    if (next < stages) {
      LoadW(sm, next % kStages, w, in, out, tile0, (first + next) * kStageK);
      LoadX(sm, next % kStages, x, rows, in, (first + next) * kStageK);
    }
    CpAsyncCommit();
    MultiplyStage(sm, it % kStages, warp, lane, acc);
  }

  // acc[nt][i] is element (row 16 * warp + lane / 4 + 8 * (i / 2) of the tile, row
  // 8 * nt + 2 * (lane % 4) + i % 2 of X).
  const int col_base = tile0 + 16 * warp + lane / 4, row_base = 2 * (lane % 4);
  if (splits == 1) {
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int col = col_base + 8 * (i / 2), r = 8 * nt + row_base + i % 2;
        if (col < out && r < rows) {
          float* o = y + static_cast<size_t>(r) * out + col;
          *o = beta == 0.0f ? acc[nt][i] : acc[nt][i] + beta * *o;
        }
      }
    }
    return;
  }
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int col = col_base + 8 * (i / 2), r = 8 * nt + row_base + i % 2;
      if (col < out && r < rows) workspace[(static_cast<size_t>(part) * rows + r) * out + col] = acc[nt][i];
    }
  }
  // Release and acquire by one thread: the barrier orders the CTA's stores before thread 0's
  // fence, which is cumulative (as last_split_merge.cuh and CUTLASS's split-K semaphore do it).
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    last_part = atomicAdd(&counters[blockIdx.x], 1) == splits - 1;
    if (last_part) {
      atomicExch(&counters[blockIdx.x], 0);  // every part has counted in: zero for the next launch
      __threadfence();                       // the other parts' sums are read after their counts
    }
  }
  __syncthreads();
  if (!last_part) return;
  for (int e = threadIdx.x; e < rows * kSkinnyMmaTileOut; e += kThreads) {
    const int r = e / kSkinnyMmaTileOut, col = tile0 + e % kSkinnyMmaTileOut;
    if (col >= out) continue;
    const float* p = workspace + static_cast<size_t>(r) * out + col;
    float sum = __ldcg(p);
    for (int q = 1; q < splits; ++q) sum += __ldcg(p + static_cast<size_t>(q) * rows * out);
    float* o = y + static_cast<size_t>(r) * out + col;
    *o = beta == 0.0f ? sum : sum + beta * *o;
  }
}

int Tiles(int out) { return (out + kSkinnyMmaTileOut - 1) / kSkinnyMmaTileOut; }
int TotalStages(int in) { return (in + kStageK - 1) / kStageK; }

bool ScratchHolds(int splits, int rows, int out, const SkinnyMmaScratch& scratch) {
  return scratch.workspace != nullptr && scratch.counters != nullptr && Tiles(out) <= scratch.counter_slots &&
         static_cast<size_t>(splits) * rows * out * sizeof(float) <= scratch.workspace_bytes;
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool SkinnyMmaGemmApplies(const void* x, int rows, int in, const __nv_bfloat16* w) {
  return rows >= kSkinnyMmaMinRows && rows <= kSkinnyMmaMaxRows && in > 0 && in % 8 == 0 && Aligned16(x) &&
         Aligned16(w);
}

int SkinnyMmaSplits(int rows, int in, int out, const SkinnyMmaScratch& scratch) {
  static const int forced = [] {
    const char* value = std::getenv("LAZYKV_SKINNY_MMA_SPLITS");
    return value == nullptr ? 0 : std::max(0, std::atoi(value));
  }();
  const int tiles = Tiles(out);
  int splits = forced > 0 ? forced : std::min(kMaxSplits, kCtasPerSm * MultiprocessorCount() / tiles);
  splits = std::clamp(splits, 1, std::max(1, TotalStages(in) / kMinStagesPerPart));
  return splits > 1 && ScratchHolds(splits, rows, out, scratch) ? splits : 1;
}

cudaError_t LaunchSkinnyMmaGemm(const __nv_bfloat16* x, int rows, int in, const __nv_bfloat16* w, int out, float* y,
                                float beta, const SkinnyMmaScratch& scratch, cudaStream_t stream, int splits) {
  if (!SkinnyMmaGemmApplies(x, rows, in, w) || out < 1 || y == nullptr || (beta != 0.0f && beta != 1.0f)) {
    return cudaErrorInvalidValue;
  }
  if (splits == 0) {
    splits = SkinnyMmaSplits(rows, in, out, scratch);
  } else if (splits < 1 || splits > TotalStages(in) || splits > 65535 ||
             (splits > 1 && !ScratchHolds(splits, rows, out, scratch))) {
    return cudaErrorInvalidValue;
  }
  const dim3 grid(Tiles(out), splits);
  if (rows <= 8) {
    return LaunchDependent(SkinnyMmaGemmKernel<1>, grid, dim3(kThreads), 0, stream, x, rows, in, w, out, y, beta,
                           scratch.workspace, scratch.counters);
  }
  return LaunchDependent(SkinnyMmaGemmKernel<2>, grid, dim3(kThreads), 0, stream, x, rows, in, w, out, y, beta,
                         scratch.workspace, scratch.counters);
}

}  // namespace lazykv::cuda
