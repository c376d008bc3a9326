#include <cudaTypedefs.h>

#include <climits>
#include <cstdint>

#include "kernels/cuda/query_tensor_map.h"

namespace lazykv::cuda {
namespace {

// cuTensorMapEncodeTiled through the runtime's driver entry point (no link to libcuda); null
// where the driver has none.
PFN_cuTensorMapEncodeTiled_v12000 EncodeTiled() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();  // leave no sticky error behind
      return static_cast<PFN_cuTensorMapEncodeTiled_v12000>(nullptr);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(ptr);
  }();
  return fn;
}

// A map over [total_queries][n_heads][head_dim] rows of `element_bytes` elements at `base`, in
// boxes of `box` (head dim, heads, rows); elements past the bounds are neither read (zeros come
// instead) nor written.
cudaError_t EncodeRowsMap(const PrefillAttentionParams& p, void* base, CUtensorMapDataType type,
                          cuuint64_t element_bytes, const cuuint32_t (&box)[3], CUtensorMapSwizzle swizzle,
                          CUtensorMap* map) {
  const cuuint64_t hd = static_cast<cuuint64_t>(p.kv.head_dim);
  const cuuint64_t dims[3] = {hd, static_cast<cuuint64_t>(p.n_heads), static_cast<cuuint64_t>(p.total_queries)};
  const cuuint64_t strides[2] = {hd * element_bytes, static_cast<cuuint64_t>(p.n_heads) * hd * element_bytes};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const CUresult r =
      EncodeTiled()(map, type, 3, base, dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                    CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

}  // namespace

bool QueryTensorMapSupported(const PrefillAttentionParams& p) {
  return p.q != nullptr && reinterpret_cast<uintptr_t>(p.q) % 16 == 0 && p.total_queries > 0 && p.n_heads > 0 &&
         p.kv.head_dim > 0 && p.kv.head_dim <= 256;
}

cudaError_t MakeQueryTensorMap(const PrefillAttentionParams& p, int pack, CUtensorMap* map) {
  if (!QueryTensorMapSupported(p) || pack <= 0 || pack > 128 || p.n_heads % pack != 0 || EncodeTiled() == nullptr) {
    return cudaErrorInvalidValue;
  }
  const cuuint32_t box[3] = {static_cast<cuuint32_t>(p.kv.head_dim), static_cast<cuuint32_t>(pack),
                             static_cast<cuuint32_t>(128 / pack)};
  // Rows past the last query come as zeros (OOB fill NONE fills zeros).
  return EncodeRowsMap(p, const_cast<float*>(p.q), CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, box, CU_TENSOR_MAP_SWIZZLE_NONE,
                       map);
}

cudaError_t MakeOutputTensorMap(const PrefillAttentionParams& p, int pack, CUtensorMap* map) {
  if (p.out_bf16 == nullptr || reinterpret_cast<uintptr_t>(p.out_bf16) % 16 != 0 || p.total_queries <= 0 ||
      p.n_heads <= 0 || (p.kv.head_dim != 64 && p.kv.head_dim != 128) || pack <= 0 || pack > 64 ||
      p.n_heads % pack != 0 || EncodeTiled() == nullptr) {
    return cudaErrorInvalidValue;
  }
  const cuuint32_t box[3] = {64, static_cast<cuuint32_t>(pack), static_cast<cuuint32_t>(64 / pack)};
  return EncodeRowsMap(p, p.out_bf16, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, box, CU_TENSOR_MAP_SWIZZLE_128B, map);
}

cudaError_t MakeKvPoolTensorMap(const PrefillAttentionParams& p, const void* pool, CUtensorMap* map) {
  const PagedKv& kv = p.kv;
  if (pool == nullptr || reinterpret_cast<uintptr_t>(pool) % 16 != 0 || kv.element != Element::kBf16 ||
      kv.pool_slots <= 0 || kv.pool_slots > INT32_MAX || kv.n_kv_heads <= 0 ||
      (kv.head_dim != 64 && kv.head_dim != 128) || EncodeTiled() == nullptr) {
    return cudaErrorInvalidValue;
  }
  const cuuint64_t hd = static_cast<cuuint64_t>(kv.head_dim), heads = static_cast<cuuint64_t>(kv.n_kv_heads);
  const cuuint64_t dims[3] = {hd, heads, static_cast<cuuint64_t>(kv.pool_slots)};
  const cuuint64_t strides[2] = {hd * 2, heads * hd * 2};
  const cuuint32_t box[3] = {64, 1, 128};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const CUresult r = EncodeTiled()(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<void*>(pool), dims, strides,
                                   box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                   CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

}  // namespace lazykv::cuda
