// The new tokens' K/V into the paged pool, keys rotated at their stored position, and
// their raw q split out of the fused QKV output (CPU twin: the RotateHeads + memcpy in the
// CPU backend's ForwardOne).
#include "kernels/cuda/element_access.cuh"
#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/rope_device.cuh"

namespace lazykv::cuda {
namespace {

template <typename T>
__global__ void KvWriteKernel(KvWriteParams p) {
  T* k_pool = static_cast<T*>(p.kv.k_pool);
  T* v_pool = static_cast<T*>(p.kv.v_pool);
  const int r = blockIdx.x;
  const int hd = p.kv.head_dim, half = hd / 2;
  const int q_dim = p.n_heads * hd, kv_dim = p.kv.n_kv_heads * hd;
  const float* row = p.qkv + static_cast<size_t>(r) * (q_dim + 2 * kv_dim);
  const size_t slot = (static_cast<size_t>(p.slot_blocks[r]) * p.kv.block_size + p.slot_index[r]) * kv_dim;
  for (int i = threadIdx.x; i < q_dim; i += blockDim.x) p.q_out[static_cast<size_t>(r) * q_dim + i] = row[i];
  const float* k = row + q_dim;
  const float* v = row + q_dim + kv_dim;
  for (int i = threadIdx.x; i < kv_dim; i += blockDim.x) v_pool[slot + i] = FromFloat<T>(v[i]);
  const long long position = p.rope_positions[r];
  for (int idx = threadIdx.x; idx < p.kv.n_kv_heads * half; idx += blockDim.x) {
    const int head = idx / half, i = idx % half;
    int a, b;
    RopePair(p.kv.rope_style, hd, i, &a, &b);
    float s, c;
    RopeSinCos(p.kv.inv_freq[i], position, &s, &c);
    const float x0 = k[head * hd + a], x1 = k[head * hd + b];
    k_pool[slot + head * hd + a] = FromFloat<T>(x0 * c - x1 * s);
    k_pool[slot + head * hd + b] = FromFloat<T>(x0 * s + x1 * c);
  }
}

}  // namespace

cudaError_t LaunchKvWrite(const KvWriteParams& p, cudaStream_t stream) {
  if (p.rows < 0 || p.n_heads <= 0 || p.kv.n_kv_heads <= 0 || p.kv.head_dim <= 0 || p.kv.head_dim % 2 != 0 ||
      p.kv.block_size <= 0) {
    return cudaErrorInvalidValue;
  }
  if (p.rows == 0) return cudaSuccess;
  WithElementType(p.kv.element, [&](auto t) { KvWriteKernel<decltype(t)><<<p.rows, 128, 0, stream>>>(p); });
  return cudaGetLastError();
}

}  // namespace lazykv::cuda
