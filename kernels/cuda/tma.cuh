// Hopper's tensor memory accelerator (TMA): one thread asks the copy engine for a box of a
// tensor map (cp.async.bulk.tensor), which lands in shared memory and counts its bytes on an
// mbarrier (the barrier's phase completes once its arrivals are in and its expected bytes have
// landed), or for a box of shared memory written to global memory (a bulk group the thread
// waits for). The persistent lazy prefill kernel reads each work tile's query rows and writes
// its bf16 output rows this way (query_tensor_map.h). Included only by the prefill kernels.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "kernels/cuda/mbarrier.cuh"

namespace lazykv::cuda::tma {

// Arrives on the barrier (one of its counted arrivals) and adds `bytes` to what its phase
// waits for.
__device__ __forceinline__ void ArriveExpectBytes(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(mbarrier::Addr(bar)), "r"(bytes)
               : "memory");
}

// The box of `map` at coordinates (c0, c1, c2), innermost first, into shared memory at dst
// (128-byte aligned; 1024 for a 128-byte swizzle); its bytes complete on `bar`, zeros for
// elements past the tensor's bounds. `map` is a kernel parameter (__grid_constant__) or in
// global memory.
__device__ __forceinline__ void Load3d(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
      "[%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(mbarrier::Addr(bar))
      : "memory");
}

// The box of `map` at coordinates (c0, c1, c2) from shared memory at src (1024-byte aligned for
// a 128-byte swizzle) to global memory, in the issuing thread's open bulk group; elements past
// the tensor's bounds are not written. The threads that wrote the box's shared memory have
// fenced it for the async proxy (wgmma::FenceProxyAsync) and met the issuing thread at a
// barrier before.
__device__ __forceinline__ void Store3d(const CUtensorMap* map, int c0, int c1, int c2, uint32_t src) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(src), "r"(c0), "r"(c1), "r"(c2)
               : "memory");
}

// Closes the issuing thread's open bulk group (Store3d's).
__device__ __forceinline__ void CommitGroup() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }

// Waits until the issuing thread's committed bulk groups have read their shared memory (the
// source may be written again); their global writes may still be under way.
__device__ __forceinline__ void WaitGroupsRead() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }

// Waits until the issuing thread's committed bulk groups are complete (their global writes too).
__device__ __forceinline__ void WaitGroups() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

}  // namespace lazykv::cuda::tma
