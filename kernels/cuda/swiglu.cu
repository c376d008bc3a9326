// SwiGLU and the fp32 -> bf16 conversion that feeds GEMMs (CPU twin: cpu::SwiGlu).
#include <algorithm>

#include "kernels/cuda/element_access.cuh"
#include "kernels/cuda/model_ops.h"

namespace lazykv::cuda {
namespace {

template <typename T>
__global__ void SwiGluKernel(const float* gu, int rows, int hidden, T* out) {
  const size_t n = static_cast<size_t>(rows) * hidden;
  for (size_t idx = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t r = idx / hidden, i = idx % hidden;
    const float g = gu[r * 2 * hidden + i], u = gu[r * 2 * hidden + hidden + i];
    out[idx] = FromFloat<T>(g / (1.0f + expf(-g)) * u);
  }
}

__global__ void ToBf16Kernel(const float* in, size_t n, __nv_bfloat16* out) {
  for (size_t idx = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<size_t>(gridDim.x) * blockDim.x) {
    out[idx] = __float2bfloat16(in[idx]);
  }
}

unsigned GridFor(size_t n) { return static_cast<unsigned>(std::min<size_t>((n + 255) / 256, 65536)); }

template <typename T>
cudaError_t SwiGlu(const float* gu, int rows, int hidden, T* out, cudaStream_t stream) {
  if (rows < 0 || hidden <= 0) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  SwiGluKernel<<<GridFor(static_cast<size_t>(rows) * hidden), 256, 0, stream>>>(gu, rows, hidden, out);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchSwiGlu(const float* gu, int rows, int hidden, __nv_bfloat16* out, cudaStream_t stream) {
  return SwiGlu(gu, rows, hidden, out, stream);
}
cudaError_t LaunchSwiGlu(const float* gu, int rows, int hidden, float* out, cudaStream_t stream) {
  return SwiGlu(gu, rows, hidden, out, stream);
}

cudaError_t LaunchToBf16(const float* in, size_t n, __nv_bfloat16* out, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  ToBf16Kernel<<<GridFor(n), 256, 0, stream>>>(in, n, out);
  return cudaGetLastError();
}

}  // namespace lazykv::cuda
