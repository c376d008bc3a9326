// The warp-specialized variant of bench/product_chain_probe.cu's persistent kernel (W and X by TMA
// boxes from one producer lane, the MMA warps on mbarriers). Bench code: device code only.
#pragma once

#include <cstdint>

#include "bench/product_chain_kernels.cuh"
#include "kernels/cuda/mbarrier.cuh"
#include "kernels/cuda/skinny_mma_stages.cuh"
#include "kernels/cuda/tma.cuh"

namespace lazykv::bench::product_chain {

// Warp-specialized (bf16 X): warps 0-3 multiply, warp 4's first lane stages each (tile, K stage)
// of W and X by one TMA box each into a ring of kStages buffers. A buffer's full barrier takes
// the producer's expected bytes; its empty barrier the four MMA warps' arrivals. No CTA barrier
// and no per-thread copies in the MMA warps' loop. The next product's stages wait for the grid
// barrier (X is the last product's output in the backend), so there is no early W here.
// KNOWN DEFECT: its check fails intermittently (one product of 16 off by 5-7% in 1 of 3 runs of
// this code; in 5 of 5 after a rewrite of its flush that should change nothing): a race not yet
// found (bench/results/product_chain_2026-11-29.md, calls 23-25). Its timings are unverified.
constexpr int kWsThreads = kThreads + 32;

__global__ void __launch_bounds__(kWsThreads)
    WarpSpecializedChainKernel(const Product* __restrict__ products, int count, unsigned long long* barrier,
                               unsigned long long base, bool /*prefetch*/) {
  constexpr int kS = cuda::skinny_mma::kStages<kNTiles, bf16>;
  __shared__ __align__(1024) cuda::skinny_mma::Stages<kNTiles, bf16> sm;
  __shared__ uint64_t full[kS], empty[kS];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    for (int b = 0; b < kS; ++b) {
      cuda::mbarrier::Init(&full[b], 1);
      cuda::mbarrier::Init(&empty[b], 4);
    }
  }
  __syncthreads();
  const unsigned long long grid = gridDim.x;
  ZeroShare(products[0]);
  int barriers = 0;
  GridBarrier(barrier, base + grid * ++barriers);
  unsigned g = 0;  // stages this CTA has passed through the ring, over every product
  for (int i = 0; i < count; ++i) {
    const Product& p = products[i];
    const int k_stages = KStages(p), out = p.out;
    int begin, end;
    Share(p, begin, end);
    const int n = end - begin;
    if (i > 0) GridBarrier(barrier, base + grid * ++barriers);
    if (i + 1 < count) ZeroShare(products[i + 1]);
    if (warp == 4) {
      if (lane == 0) {
        for (int f = 0; f < n; ++f) {
          const unsigned u = g + f, b = u % kS;
          WaitOrTrap(&empty[b], ((u / kS) & 1) ^ 1);
          cuda::tma::ArriveExpectBytes(&full[b], sizeof(sm.w[0]) + sizeof(sm.x[0]));
          const int tile0 = (begin + f) / k_stages * 64, k0 = (begin + f) % k_stages * kStageK;
          cuda::tma::Load3d(static_cast<uint32_t>(__cvta_generic_to_shared(&sm.w[b][0])), &p.w_map, k0, tile0, 0,
                            &full[b]);
          cuda::tma::Load3d(static_cast<uint32_t>(__cvta_generic_to_shared(&sm.x[b][0])), &p.x_map, k0, 0, 0, &full[b]);
        }
      }
    } else {
      float acc[kNTiles][4] = {};
      for (int f = 0; f < n; ++f) {
        const unsigned u = g + f, b = u % kS;
        WaitOrTrap(&full[b], (u / kS) & 1);
        MultiplyStage(sm, b, warp, lane, acc);
        __syncwarp();
        if (lane == 0) cuda::mbarrier::Arrive(&empty[b]);
        if (f == n - 1 || (begin + f) % k_stages == k_stages - 1) {
          const int t0 = (begin + f) / k_stages * 64;
#pragma unroll
          for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int m = 16 * warp + lane / 4 + 8 * (e / 2), r = 8 * nt + 2 * (lane % 4) + e % 2;
              if (t0 + m < out) atomicAdd(p.y + static_cast<size_t>(r) * out + t0 + m, acc[nt][e]);
              acc[nt][e] = 0.0f;
            }
          }
        }
      }
    }
    g += n;
  }
}

}  // namespace lazykv::bench::product_chain
