// Row gathers on the GPU: the embedding lookup (the CPU twin is the row copy in the CPU
// backend) and the rows the output layer reads. Both element types (element_type.h).
#include "kernels/cuda/element_access.cuh"
#include "kernels/cuda/model_ops.h"

namespace lazykv::cuda {
namespace {

template <typename T>
__global__ void EmbeddingGatherKernel(const T* table, const int32_t* tokens, int dim, float* x) {
  const int row = blockIdx.x;
  const T* src = table + static_cast<size_t>(tokens[row]) * dim;
  float* dst = x + static_cast<size_t>(row) * dim;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) dst[i] = ToFloat(src[i]);
}

template <typename T>
__global__ void GatherRowsKernel(const T* src, const int32_t* rows, int dim, T* dst) {
  const T* from = src + static_cast<size_t>(rows[blockIdx.x]) * dim;
  T* to = dst + static_cast<size_t>(blockIdx.x) * dim;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) to[i] = from[i];
}

template <typename T>
cudaError_t GatherRows(const T* src, const int32_t* rows, int n, int dim, T* dst, cudaStream_t stream) {
  if (n < 0 || dim <= 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  GatherRowsKernel<<<n, 256, 0, stream>>>(src, rows, dim, dst);
  return cudaGetLastError();
}

template <typename T>
cudaError_t EmbeddingGather(const T* table, const int32_t* tokens, int rows, int dim, float* x, cudaStream_t stream) {
  if (rows < 0 || dim <= 0) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  EmbeddingGatherKernel<<<rows, 256, 0, stream>>>(table, tokens, dim, x);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchGatherRows(const __nv_bfloat16* src, const int32_t* rows, int n, int dim, __nv_bfloat16* dst,
                             cudaStream_t stream) {
  return GatherRows(src, rows, n, dim, dst, stream);
}
cudaError_t LaunchGatherRows(const float* src, const int32_t* rows, int n, int dim, float* dst, cudaStream_t stream) {
  return GatherRows(src, rows, n, dim, dst, stream);
}

cudaError_t LaunchEmbeddingGather(const __nv_bfloat16* table, const int32_t* tokens, int rows, int dim, float* x,
                                  cudaStream_t stream) {
  return EmbeddingGather(table, tokens, rows, dim, x, stream);
}
cudaError_t LaunchEmbeddingGather(const float* table, const int32_t* tokens, int rows, int dim, float* x,
                                  cudaStream_t stream) {
  return EmbeddingGather(table, tokens, rows, dim, x, stream);
}

}  // namespace lazykv::cuda
