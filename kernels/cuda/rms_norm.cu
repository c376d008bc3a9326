// RMSNorm fused with the residual add on the GPU (CPU twins: cpu::AddInPlace, cpu::RmsNorm).
// One CTA per row: the add and the sum of squares in one pass over x, the scaling in a
// second pass over the row (which is in L1/L2 by then).
#include "kernels/cuda/element_access.cuh"
#include "kernels/cuda/model_ops.h"

namespace lazykv::cuda {
namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void ResidualRmsNormKernel(float* x, const float* residual, const float* weight, int dim, float eps,
                                      T* out) {
  const size_t base = static_cast<size_t>(blockIdx.x) * dim;
  float* xr = x + base;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < dim; i += kThreads) {
    float v = xr[i];
    if (residual != nullptr) {
      v += residual[base + i];
      xr[i] = v;
    }
    ss += v * v;
  }
  __shared__ float partial[kThreads / 32];
  for (int offset = 16; offset > 0; offset /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, offset);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = ss;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < kThreads / 32; ++w) total += partial[w];
  const float scale = rsqrtf(total / dim + eps);
  for (int i = threadIdx.x; i < dim; i += kThreads) out[base + i] = FromFloat<T>(weight[i] * (xr[i] * scale));
}

template <typename T>
cudaError_t ResidualRmsNorm(float* x, const float* residual, const float* weight, int rows, int dim, float eps, T* out,
                            cudaStream_t stream) {
  if (rows < 0 || dim <= 0) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  ResidualRmsNormKernel<<<rows, kThreads, 0, stream>>>(x, residual, weight, dim, eps, out);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchResidualRmsNorm(float* x, const float* residual, const float* weight, int rows, int dim, float eps,
                                  __nv_bfloat16* out, cudaStream_t stream) {
  return ResidualRmsNorm(x, residual, weight, rows, dim, eps, out, stream);
}
cudaError_t LaunchResidualRmsNorm(float* x, const float* residual, const float* weight, int rows, int dim, float eps,
                                  float* out, cudaStream_t stream) {
  return ResidualRmsNorm(x, residual, weight, rows, dim, eps, out, stream);
}

}  // namespace lazykv::cuda
