// Chunk payload <-> pool blocks on the GPU (CPU twin: CpuBackend's ForEachBlockRun
// memcpys). One CTA per (block, K|V, layer) copies the block's rows, which are contiguous
// on both sides: in 16-byte vectors when a row is a whole number of them, else by element.
#include "kernels/cuda/element_access.cuh"
#include "kernels/cuda/model_ops.h"

namespace lazykv::cuda {
namespace {

// E: the element type; T: the unit each thread copies (E itself, or a 16-byte vector).
template <typename E, typename T>
__global__ void KvTransferKernel(KvTransferParams p) {
  const int i = blockIdx.x, kind = blockIdx.y, layer = p.first_layer + blockIdx.z;
  const size_t kv_dim = static_cast<size_t>(p.kv.n_kv_heads) * p.kv.head_dim;
  const size_t plane = static_cast<size_t>(p.chunk_tokens) * kv_dim;
  E* payload = static_cast<E*>(p.payload) + (2 * static_cast<size_t>(layer) + kind) * plane +
               static_cast<size_t>(p.token_offsets[i]) * kv_dim;
  const size_t layer_elems = static_cast<size_t>(p.pool_blocks) * p.kv.block_size * kv_dim;
  E* pool = static_cast<E*>(kind == 0 ? p.kv.k_pool : p.kv.v_pool) + layer * layer_elems +
            static_cast<size_t>(p.kv.block_ids[i]) * p.kv.block_size * kv_dim;
  constexpr size_t kPer = sizeof(T) / sizeof(E);
  const size_t n = static_cast<size_t>(p.kv.block_tokens[i]) * kv_dim / kPer;
  T* src = reinterpret_cast<T*>(p.to_pool ? payload : pool);
  T* dst = reinterpret_cast<T*>(p.to_pool ? pool : payload);
  for (size_t e = threadIdx.x; e < n; e += blockDim.x) dst[e] = src[e];
}

template <typename E>
void Launch(const KvTransferParams& p, cudaStream_t stream) {
  const dim3 grid(p.num_blocks_in_chunk, 2, p.num_layers);
  constexpr int kPerVector = 16 / sizeof(E);
  const int kv_dim = p.kv.n_kv_heads * p.kv.head_dim;
  const bool aligned = kv_dim % kPerVector == 0 && reinterpret_cast<uintptr_t>(p.payload) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(p.kv.k_pool) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(p.kv.v_pool) % 16 == 0;
  if (aligned) {
    KvTransferKernel<E, int4><<<grid, 256, 0, stream>>>(p);
  } else {
    KvTransferKernel<E, E><<<grid, 256, 0, stream>>>(p);
  }
}

}  // namespace

cudaError_t LaunchKvTransfer(const KvTransferParams& p, cudaStream_t stream) {
  if (p.num_blocks_in_chunk < 0 || p.num_blocks_in_chunk > (1 << 30) || p.kv.n_kv_heads <= 0 || p.kv.head_dim <= 0 ||
      p.kv.block_size <= 0 || p.num_layers < 0 || p.num_layers > 65535 || p.first_layer < 0) {
    return cudaErrorInvalidValue;
  }
  if (p.num_blocks_in_chunk == 0 || p.num_layers == 0) return cudaSuccess;
  WithElementType(p.kv.element, [&](auto t) { Launch<decltype(t)>(p, stream); });
  return cudaGetLastError();
}

}  // namespace lazykv::cuda
