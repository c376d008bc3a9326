// Row gathers on the GPU: the embedding lookup (the CPU twin is the row copy in the CPU
// backend) and the rows the output layer reads.
#include "kernels/cuda/model_ops.h"

namespace lazykv::cuda {
namespace {

__global__ void EmbeddingGatherKernel(const __nv_bfloat16* table, const int32_t* tokens, int dim, float* x) {
  const int row = blockIdx.x;
  const __nv_bfloat16* src = table + static_cast<size_t>(tokens[row]) * dim;
  float* dst = x + static_cast<size_t>(row) * dim;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) dst[i] = __bfloat162float(src[i]);
}

__global__ void GatherRowsKernel(const __nv_bfloat16* src, const int32_t* rows, int dim, __nv_bfloat16* dst) {
  const __nv_bfloat16* from = src + static_cast<size_t>(rows[blockIdx.x]) * dim;
  __nv_bfloat16* to = dst + static_cast<size_t>(blockIdx.x) * dim;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) to[i] = from[i];
}

}  // namespace

cudaError_t LaunchGatherRows(const __nv_bfloat16* src, const int32_t* rows, int n, int dim, __nv_bfloat16* dst,
                             cudaStream_t stream) {
  if (n < 0 || dim <= 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  GatherRowsKernel<<<n, 256, 0, stream>>>(src, rows, dim, dst);
  return cudaGetLastError();
}

cudaError_t LaunchEmbeddingGather(const __nv_bfloat16* table, const int32_t* tokens, int rows, int dim, float* x,
                                  cudaStream_t stream) {
  if (rows < 0 || dim <= 0) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  EmbeddingGatherKernel<<<rows, 256, 0, stream>>>(table, tokens, dim, x);
  return cudaGetLastError();
}

}  // namespace lazykv::cuda
