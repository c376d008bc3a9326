// Asynchronous copies global -> shared memory (device code): cp.async of 16 bytes with zero
// fill, its commit groups and waits, for the kernels that stage tiles by hand (the decode
// kernels, the tensor-core skinny GEMM).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace lazykv::cuda::async_copy {

// 16 bytes global -> shared; src_bytes 0 fills zeros (masked rows must not feed NaN).
__device__ __forceinline__ void CpAsync16(void* dst, const void* src, int src_bytes) {
  const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(src_bytes) : "memory");
}

// The same for data read once (a GEMM's weights): L2 is also asked for the 256 bytes around
// the copy, so the next copies along the row come from L2.
__device__ __forceinline__ void CpAsync16Streamed(void* dst, const void* src, int src_bytes) {
  const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(src_bytes)
               : "memory");
}

__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

}  // namespace lazykv::cuda::async_copy
