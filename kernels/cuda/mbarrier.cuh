// Shared-memory mbarriers (sm_90) for handing buffers between warps of one CTA: a barrier
// completes a phase when `count` threads have arrived; a waiter names the parity of the
// phase it waits for (0 for the first, then alternating), as CUTLASS's pipelines do.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace lazykv::cuda::mbarrier {

__device__ __forceinline__ uint32_t Addr(const uint64_t* bar) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(bar));
}

// One thread initializes; a CTA barrier (__syncthreads) must follow before any use.
__device__ __forceinline__ void Init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(Addr(bar)), "r"(count) : "memory");
}

// Release: this thread's earlier shared-memory writes are seen by whoever waits on the phase.
__device__ __forceinline__ void Arrive(uint64_t* bar) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(Addr(bar)) : "memory");
}

// Arrives once all of this thread's earlier cp.async copies have landed (counted in the
// barrier's expected arrivals: .noinc). A reader that waits on the phase and then reads the
// copies through the async proxy (wgmma) fences first (fence.proxy.async).
__device__ __forceinline__ void ArriveOnCopies(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(Addr(bar)) : "memory");
}

// Acquire: spins until the phase of the given parity has completed.
__device__ __forceinline__ void Wait(uint64_t* bar, int parity) {
  asm volatile(
      "{\n.reg .pred done;\nLAB_WAIT:\n"  // a label is local to its { } scope in PTX
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra LAB_WAIT;\n}\n" ::"r"(Addr(bar)),
      "r"(parity)
      : "memory");
}

}  // namespace lazykv::cuda::mbarrier
