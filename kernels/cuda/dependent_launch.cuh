// Programmatic dependent launch (Hopper): a kernel launched with LaunchDependent may be
// started while the kernel before it on the stream is still running, so its CTAs are
// resident and waiting when that one ends, and the launch latency between the two (about
// 1.7 us a kernel in a batch-1 decode step, bench/cuda_backend_bench --kernel-trace) leaves
// the step's path.
//
// Contract for a kernel launched with LaunchDependent: it calls WaitForPriorGrid() before it
// reads anything an earlier kernel wrote and before it writes anything an earlier kernel may
// read; the wait returns once the kernel before it has completed and its writes are visible
// (and that one had waited for its own predecessor, so every earlier kernel has). A short
// kernel calls AllowDependentLaunch() first, so that the next one's CTAs are resident when it
// ends; a long memory-bound one does not (the next one's CTAs would wait beside it all along,
// and cost it ~10% in the skinny GEMM; letting them in only for its tail cost too) and its
// successor starts when it ends. The lazy prefill kernels (compute-bound, one CTA an SM) do
// call it first, measured faster: their successor is the small combine of their splits.
// A kernel that starts its successor only as it ends, after its own wait, also orders every
// kernel after it behind every kernel before it; the one-tile prefill kernel relies on that
// (it reads work starts that an earlier layer's launch made before its own wait:
// PrefillAttentionParams::work_starts_made), so a layer's GEMMs must keep it.
// Launched without the attribute (<<<>>>), both calls are no-ops and the kernel runs as always.
//
// LAZYKV_DEPENDENT_LAUNCH=0 in the environment makes LaunchDependent an ordinary launch (for
// benchmarks: the same binary with and without).
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "common/env_switch.h"

namespace lazykv::cuda {

__device__ __forceinline__ void WaitForPriorGrid() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
__device__ __forceinline__ void AllowDependentLaunch() { asm volatile("griddepcontrol.launch_dependents;\n" ::); }

// kernel<<<grid, block, smem, stream>>>(args...) with programmatic stream serialization; the
// launch's error, which it also takes off the pending error (cudaGetLastError), as a
// <<<>>> launch checked with cudaGetLastError would report it.
inline bool DependentLaunchEnabled() {
  static const bool enabled = EnvSwitchOn("LAZYKV_DEPENDENT_LAUNCH");
  return enabled;
}

template <typename... Params, typename... Args>
cudaError_t LaunchDependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                            Args&&... args) {
  if (!DependentLaunchEnabled()) {
    kernel<<<grid, block, smem, stream>>>(std::forward<Args>(args)...);
    return cudaGetLastError();
  }
  cudaLaunchAttribute attribute;
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  const cudaError_t err = cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
  const cudaError_t pending = cudaGetLastError();
  return err != cudaSuccess ? err : pending;
}

}  // namespace lazykv::cuda
