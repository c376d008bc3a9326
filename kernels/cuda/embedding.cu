// Embedding gather on the GPU (the CPU twin is the row copy in the CPU backend).
#include "kernels/cuda/model_ops.h"

namespace lazykv::cuda {
namespace {

__global__ void EmbeddingGatherKernel(const __nv_bfloat16* table, const int32_t* tokens, int dim, float* x) {
  const int row = blockIdx.x;
  const __nv_bfloat16* src = table + static_cast<size_t>(tokens[row]) * dim;
  float* dst = x + static_cast<size_t>(row) * dim;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) dst[i] = __bfloat162float(src[i]);
}

}  // namespace

cudaError_t LaunchEmbeddingGather(const __nv_bfloat16* table, const int32_t* tokens, int rows, int dim, float* x,
                                  cudaStream_t stream) {
  if (rows < 0 || dim <= 0) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  EmbeddingGatherKernel<<<rows, 256, 0, stream>>>(table, tokens, dim, x);
  return cudaGetLastError();
}

}  // namespace lazykv::cuda
