// The persistent kernels of bench/product_chain_probe.cu: a step's 16-row products in one
// cooperative launch (stream-K shares, atomics into y, a grid barrier between products), with the
// variants the probe times. Bench code: device code only, no state but the launch's own.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/mbarrier.cuh"
#include "kernels/cuda/skinny_mma_stages.cuh"
#include "kernels/cuda/tma.cuh"

namespace lazykv::bench::product_chain {

using bf16 = __nv_bfloat16;
using cuda::async_copy::CpAsyncCommit;
using cuda::async_copy::CpAsyncWait;
using cuda::skinny_mma::Epilogue;
using cuda::skinny_mma::kStageK;
using cuda::skinny_mma::kThreads;
using cuda::skinny_mma::LoadW;
using cuda::skinny_mma::LoadX;
using cuda::skinny_mma::MultiplyStage;

constexpr int kRows = 16;
constexpr int kNTiles = kRows / 8;

struct Product {
  CUtensorMap w_map;  // W [out][in] in boxes of 64 x 64, 128-byte swizzle: LoadW's layout
  CUtensorMap x_map;  // bf16 X [16][in] in boxes of 64 x 16, the same swizzle: LoadX's layout
  const bf16* w;      // [out][in]
  const void* x;      // [kRows][in], float or bf16 (the kernel's XT)
  float* y;           // [kRows][out], zero before the product (the kernel zeroes the next one's)
  int in, out;
  const bf16* w_packed;    // W as 8 KB blocks, one a (tile, K stage) in its shared-memory layout
  const bf16* w_packed_k;  // the same blocks in K-stage-major order ([K stage][tile])
};

__device__ __forceinline__ int Tiles(const Product& p) { return (p.out + 63) / 64; }
__device__ __forceinline__ int KStages(const Product& p) { return (p.in + kStageK - 1) / kStageK; }

// Every CTA counts in on `counter`; returns once it reaches `target` (the launch's base plus the
// grid size times the barriers so far). Needs every CTA resident: a cooperative launch.
inline __device__ void GridBarrier(unsigned long long* counter, unsigned long long target) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(counter, 1ull);
    unsigned long long seen, start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
      asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(seen) : "l"(counter) : "memory");
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
      if (now - start > 2000000000ull) __trap();  // 2 s: a miscounted barrier fails instead of hanging
    } while (seen < target);
  }
  __syncthreads();
}

// This CTA's share of zeroing the product's y (before the barrier that precedes its sums).
__device__ __forceinline__ void ZeroShare(const Product& p) {
  const int n = kRows * p.out;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p.y[i] = 0.0f;
}

// mbarrier::Wait that traps after 2 s instead of spinning for ever (a probe's miscounted barrier or
// expected bytes fail the run instead of hanging the device).
__device__ __forceinline__ void WaitOrTrap(uint64_t* bar, int parity) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  for (;;) {
    uint32_t done;
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(cuda::mbarrier::Addr(bar)), "r"(parity)
                 : "memory");
    if (done) return;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    if (now - start > 2000000000ull) __trap();
  }
}

// The end of a tile's run in a CTA's share: its partial sums (acc, this warp's 16 rows of the
// tile from t0) added into y, and acc zeroed for the next run.
__device__ __forceinline__ void FlushTile(const Product& p, int t0, int warp, int lane, float (&acc)[kNTiles][4]) {
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int m = 16 * warp + lane / 4 + 8 * (e / 2), r = 8 * nt + 2 * (lane % 4) + e % 2;
      if (t0 + m < p.out) atomicAdd(p.y + static_cast<size_t>(r) * p.out + t0 + m, acc[nt][e]);
      acc[nt][e] = 0.0f;
    }
  }
}

// CTA b's share of the product's tiles x K-stages pairs (tile-major), [begin, end).
__device__ __forceinline__ void Share(const Product& p, int& begin, int& end) {
  const long long total = static_cast<long long>(Tiles(p)) * KStages(p);
  begin = static_cast<int>(total * blockIdx.x / gridDim.x);
  end = static_cast<int>(total * (blockIdx.x + 1) / gridDim.x);
}

// How a stage of W reaches shared memory: LoadW's cp.async copies (W as it is), a contiguous
// copy of the packed block, or one TMA box (W as it is).
// kWavefront: K-stage-major packed blocks, each CTA one (tile, part of K) (parts: as many as the
// grid allows, at least 4 stages each), so that at any moment the CTAs of a part read one
// contiguous run of blocks. Needs at least as many CTAs as the product has tiles.
enum class WLoad { kCpAsync, kPacked, kTma, kWavefront };

// The stages: static shared memory at the default count, dynamic for a deeper ring (kDeep).
template <typename S, bool kDynamic>
__device__ __forceinline__ S& StageStorage() {
  if constexpr (kDynamic) {
    // The declared alignment places the dynamic base on 1024 bytes (ptxas pads the static part),
    // as the 128-byte swizzle of TMA boxes needs.
    extern __shared__ __align__(1024) unsigned char dynamic_stages[];
    return *reinterpret_cast<S*>(dynamic_stages);
  } else {
    __shared__ __align__(1024) S stages;
    return stages;
  }
}

// kDeep > 0: that many stages in dynamic shared memory (1 or 2 CTAs an SM) instead of the
// kernels' 3-4 in static shared memory, for the bytes of W in flight.
// kStageOnly: the copies and waits without the products (a timing probe: its sums are zeros).
template <typename XT, WLoad kW, bool kXOnce = false, int kDeep = 0, bool kStageOnly = false>
__global__ void __launch_bounds__(kThreads)
    ProductChainKernel(const Product* __restrict__ products, int count, unsigned long long* barrier,
                       unsigned long long base, bool prefetch) {
  constexpr int kStagesInFlight = kDeep > 0 ? kDeep : cuda::skinny_mma::kStages<kNTiles, XT>;
  static_assert(kStagesInFlight <= 32, "w_phases has a bit a stage");
  using StagesT = cuda::skinny_mma::Stages<kNTiles, XT, kStagesInFlight>;
  StagesT& sm = StageStorage<StagesT, (kDeep > 0)>();
  __shared__ uint64_t w_full[kStagesInFlight];  // kTma: a buffer's W has landed
  if constexpr (kW == WLoad::kTma) {
    if (threadIdx.x == 0) {
      for (int s = 0; s < kStagesInFlight; ++s) cuda::mbarrier::Init(&w_full[s], 1);
    }
    __syncthreads();
  }
  uint32_t w_phases = 0;  // kTma: bit b, the parity of buffer b's next phase
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const unsigned long long grid = gridDim.x;
  // y of product 0 zeroed by every CTA's share, then the first barrier.
  ZeroShare(products[0]);
  int barriers = 0;
  GridBarrier(barrier, base + grid * ++barriers);

  for (int i = 0; i < count; ++i) {
    const Product p = products[i];
    const int k_stages = KStages(p);
    int begin, end, fixed_tile = 0;
    if constexpr (kW == WLoad::kWavefront) {
      const int tiles = Tiles(p), parts = max(1, min(static_cast<int>(gridDim.x) / tiles, k_stages / 4));
      const int c = blockIdx.x, part = c / tiles;
      fixed_tile = c % tiles;
      begin = c < tiles * parts ? part * k_stages / parts : 0;
      end = c < tiles * parts ? (part + 1) * k_stages / parts : 0;
    } else {
      Share(p, begin, end);
    }
    const int n = end - begin;
    // Stage f of the share: tile (begin + f) / k_stages, K stage (begin + f) % k_stages (kWavefront:
    // tile fixed_tile, K stage begin + f).
    auto tile0 = [&](int f) { return kW == WLoad::kWavefront ? fixed_tile * 64 : (begin + f) / k_stages * 64; };
    auto k0 = [&](int f) { return (begin + f) % k_stages * kStageK; };
    // Stage f's W into `buffer`: packed (or the wavefront's K-major blocks), a contiguous copy.
    auto load_w = [&](int buffer, int f) {
      if constexpr (kW == WLoad::kTma) {
        if (threadIdx.x == 0) {
          cuda::tma::ArriveExpectBytes(&w_full[buffer], sizeof(sm.w[0]));
          cuda::tma::Load3d(static_cast<uint32_t>(__cvta_generic_to_shared(&sm.w[buffer][0])), &products[i].w_map,
                            k0(f), tile0(f), 0, &w_full[buffer]);
        }
      } else if constexpr (kW == WLoad::kPacked || kW == WLoad::kWavefront) {
        const uint4* block = kW == WLoad::kPacked
                                 ? reinterpret_cast<const uint4*>(p.w_packed) + static_cast<size_t>(begin + f) * 512
                                 : reinterpret_cast<const uint4*>(p.w_packed_k) +
                                       (static_cast<size_t>(begin + f) * Tiles(p) + fixed_tile) * 512;
#pragma unroll
        for (int j = 0; j < 512 / kThreads; ++j) {
          const int q = threadIdx.x + j * kThreads;
          cuda::async_copy::CpAsync16Streamed(&sm.w[buffer][q], block + q, 16);
        }
      } else {
        LoadW<Epilogue::kStore>(sm, buffer, p.w, p.in, p.out, tile0(f), k0(f));
      }
    };
    if (i > 0) {
      if (prefetch) {
        for (int s = 0; s < kStagesInFlight - 1 && s < n; ++s) load_w(s, s);
      }
      GridBarrier(barrier, base + grid * ++barriers);  // product i - 1's sums are all in its y
      if (!prefetch) {
        for (int s = 0; s < kStagesInFlight - 1 && s < n; ++s) load_w(s, s);
      }
    } else {
      for (int s = 0; s < kStagesInFlight - 1 && s < n; ++s) load_w(s, s);
    }
    if (i + 1 < count) ZeroShare(products[i + 1]);
    for (int s = 0; s < kStagesInFlight - 1; ++s) {
      if (s < n) LoadX(sm, s, static_cast<const XT*>(p.x), kRows, p.in, k0(s));
      CpAsyncCommit();
    }
    float acc[kNTiles][4] = {};
    for (int f = 0; f < n; ++f) {
      CpAsyncWait<kStagesInFlight - 2>();
      if constexpr (kW == WLoad::kTma) {
        const int b = f % kStagesInFlight;
        WaitOrTrap(&w_full[b], (w_phases >> b) & 1);
        w_phases ^= 1u << b;
      }
      __syncthreads();
      const int next = f + kStagesInFlight - 1;
      if (next < n) {
        load_w(next % kStagesInFlight, next);
        if (!kXOnce) LoadX(sm, next % kStagesInFlight, static_cast<const XT*>(p.x), kRows, p.in, k0(next));
      }
      CpAsyncCommit();
      if constexpr (!kStageOnly) MultiplyStage(sm, f % kStagesInFlight, warp, lane, acc);
      if (f == n - 1 || (begin + f) % k_stages == k_stages - 1) FlushTile(p, tile0(f), warp, lane, acc);
    }
    CpAsyncWait<0>();
    __syncthreads();  // every warp is past its last stage before the buffers take the next product's W
  }
}

}  // namespace lazykv::bench::product_chain
