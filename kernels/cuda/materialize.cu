// The block baseline's materialize on the GPU (the CPU twin is cpu::CopyBlockRotated).
#include <cuda_bf16.h>

#include "kernels/cuda/element_access.cuh"
#include "kernels/cuda/materialize.h"
#include "kernels/cuda/rope_device.cuh"

namespace lazykv::cuda {
namespace {

template <typename T>
__global__ void MaterializeKernel(MaterializeParams p) {
  const int copy = blockIdx.x;
  const int src = p.src_blocks[copy], dst = p.dst_blocks[copy], n = p.num_tokens[copy], delta = p.deltas[copy];
  const int hd = p.kv.head_dim, half = hd / 2;
  T* k = static_cast<T*>(p.kv.k_pool);
  T* v = static_cast<T*>(p.kv.v_pool);
  const size_t slot_width = static_cast<size_t>(p.kv.n_kv_heads) * hd;
  const size_t src_base = static_cast<size_t>(src) * p.kv.block_size * slot_width;
  const size_t dst_base = static_cast<size_t>(dst) * p.kv.block_size * slot_width;
  for (int idx = threadIdx.x; idx < n * p.kv.n_kv_heads * half; idx += blockDim.x) {
    const int i = idx % half, row = idx / half;  // row = slot * n_kv_heads + head
    int a, b;
    RopePair(p.kv.rope_style, hd, i, &a, &b);
    float s, c;
    RopeSinCos(p.kv.inv_freq[i], delta, &s, &c);
    const size_t r = static_cast<size_t>(row) * hd;
    const float x0 = ToFloat(k[src_base + r + a]), x1 = ToFloat(k[src_base + r + b]);
    k[dst_base + r + a] = FromFloat<T>(x0 * c - x1 * s);
    k[dst_base + r + b] = FromFloat<T>(x0 * s + x1 * c);
  }
  for (size_t idx = threadIdx.x; idx < static_cast<size_t>(n) * slot_width; idx += blockDim.x) {
    v[dst_base + idx] = v[src_base + idx];
  }
}

}  // namespace

cudaError_t LaunchMaterialize(const MaterializeParams& p, cudaStream_t stream) {
  if (p.num_copies == 0) return cudaSuccess;
  if (p.num_copies < 0 || p.kv.head_dim % 2 != 0 || p.kv.block_size <= 0) return cudaErrorInvalidValue;
  WithElementType(p.kv.element, [&](auto t) { MaterializeKernel<decltype(t)><<<p.num_copies, 256, 0, stream>>>(p); });
  return cudaGetLastError();
}

}  // namespace lazykv::cuda
