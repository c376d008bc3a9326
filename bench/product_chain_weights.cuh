// The weights of bench/product_chain_probe.cu and bench/product_register_probe.cu: the products of
// the Llama-3-8B shape and their layout in one allocation, random fill, the packed copy, a tensor
// map for TMA boxes, and the plain read that is the probes' floor. Bench code; device helpers and
// host functions with no state.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cuda/skinny_mma_gemm.h"
#include "kernels/cuda/skinny_mma_stages.cuh"

namespace lazykv::bench::product_chain {

using bf16 = __nv_bfloat16;
using cuda::skinny_mma::kStageK;

// One of a layer's products: X [rows][in] W^T with W [out][in].
struct Shape {
  const char* name;
  int in, out;
  int cap;  // the backend's split cap for it (SkinnyMmaSplits)
};

// A step's products of 16 rows, in one allocation: `layers` times the products named by `only`
// (all four where empty). Product i has shape(i), its W at w_offset[i] elements and its y at
// y_offset[i].
struct ProductLayout {
  std::vector<Shape> shapes;
  int per_layer = 0, count = 0;
  std::vector<size_t> w_offset, y_offset;
  size_t w_elems = 0, y_elems = 0, max_out = 0, max_in = 0;

  const Shape& shape(int i) const { return shapes[i % per_layer]; }
};

// false where `only` names no product.
inline bool MakeProductLayout(const std::string& only, int layers, int rows, ProductLayout* layout) {
  static const Shape kAll[] = {{"qkv", 4096, 6144, cuda::kSkinnyMmaSplitCap},
                               {"output", 4096, 4096, cuda::kSkinnyMmaSplitCapAfterAttention},
                               {"gate_up", 4096, 28672, cuda::kSkinnyMmaSplitCap},
                               {"down", 14336, 4096, cuda::kSkinnyMmaSplitCap}};
  ProductLayout& l = *layout;
  l = {};
  for (const Shape& s : kAll) {
    if (only.empty() || only == s.name) l.shapes.push_back(s);
  }
  if (l.shapes.empty()) return false;
  l.per_layer = static_cast<int>(l.shapes.size());
  l.count = l.per_layer * layers;
  for (int i = 0; i < l.count; ++i) {
    l.w_offset.push_back(l.w_elems);
    l.y_offset.push_back(l.y_elems);
    l.w_elems += static_cast<size_t>(l.shape(i).in) * l.shape(i).out;
    l.y_elems += static_cast<size_t>(rows) * l.shape(i).out;
    l.max_out = std::max<size_t>(l.max_out, l.shape(i).out);
    l.max_in = std::max<size_t>(l.max_in, l.shape(i).in);
  }
  return true;
}

// W [out][in] (in a multiple of 64) as blocks of 512 16-byte chunks, one a (tile of 64 rows, K
// stage of 64 columns), chunk c of row r at r * 8 + (c ^ (r % 8)): what LoadW puts in shared
// memory. Blocks in [tile][K stage] order, or [K stage][tile] with `k_major`. Rows past `out`
// repeat the last, as LoadW loads them.
__global__ void PackWeights(const uint4* __restrict__ w, int in, int out, uint4* __restrict__ packed, bool k_major) {
  const int k_stages = in / kStageK, row_chunks = in / 8, tiles = (out + 63) / 64;
  const size_t total = static_cast<size_t>(tiles) * k_stages * 512;
  for (size_t q = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; q < total;
       q += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t block = q / 512;
    const int within = static_cast<int>(q % 512), r = within / 8, c = (within % 8) ^ (r % 8);
    const int tile = static_cast<int>(k_major ? block % tiles : block / k_stages);
    const int ks = static_cast<int>(k_major ? block / tiles : block % k_stages);
    const int row = min(tile * 64 + r, out - 1);
    packed[q] = w[static_cast<size_t>(row) * row_chunks + ks * 8 + c];
  }
}

__global__ void FillUniform(bf16* w, size_t n, float bound, uint64_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint64_t z = (i + 1) * 0x9E3779B97F4A7C15ull + seed;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const float u = static_cast<float>(z >> 40) / static_cast<float>(1 << 24);  // [0, 1)
    w[i] = __float2bfloat16((2.0f * u - 1.0f) * bound);
  }
}

// Reads every byte of the weights (16 bytes a load, several in flight); writes only if an
// impossible sum comes out, so the loads are not removed.
__global__ void ReadWeights(const uint4* __restrict__ w, size_t n, unsigned* sink) {
  unsigned acc = 0;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 a = __ldcs(w + i), b = __ldcs(w + i + stride), c = __ldcs(w + i + 2 * stride),
                d = __ldcs(w + i + 3 * stride);
    acc ^= a.x ^ b.y ^ c.z ^ d.w;
  }
  for (; i < n; i += stride) acc ^= __ldcs(w + i).x;
  if (acc == 0x12345678u) *sink = acc;
}

// How far a product's y is from the reference's: max |difference| over max |reference|, infinite
// where y holds a NaN (a product left unwritten). `bad` where that is over 1e-4 or the
// reference vanished (its largest value under 0.1: random inputs make it about 1).
struct ProductError {
  double relative = 0.0;
  bool bad = false;
};
inline ProductError CompareProduct(const float* want, const float* got, size_t n) {
  double scale = 0.0, diff = 0.0;
  for (size_t j = 0; j < n; ++j) {
    scale = std::max(scale, std::fabs(static_cast<double>(want[j])));
    const double d = std::fabs(static_cast<double>(want[j]) - got[j]);
    if (!std::isfinite(d)) {
      diff = INFINITY;
      break;
    }
    diff = std::max(diff, d);
  }
  const double relative = diff / std::max(scale, 1e-6);
  return {relative, !(relative <= 1e-4) || scale < 0.1};
}

// A map over a bf16 matrix [rows][in] in boxes of 64 columns x box_rows rows with the 128-byte
// swizzle (chunk c of row r at r * 8 + (c ^ (r % 8)), LoadW's and LoadX's layout); rows past
// `rows` come as zeros. W: box_rows 64; X: 16.
inline bool EncodeWeightMap(const bf16* w, int in, int out, CUtensorMap* map, int box_rows = 64) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) !=
          cudaSuccess ||
      found != cudaDriverEntryPointSuccess) {
    return false;
  }
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(in), static_cast<cuuint64_t>(out), 1};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(in) * 2, static_cast<cuuint64_t>(in) * out * 2};
  const cuuint32_t box[3] = {64, static_cast<cuuint32_t>(box_rows), 1}, element_strides[3] = {1, 1, 1};
  return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn)(
             map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<bf16*>(w), dims, strides, box, element_strides,
             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace lazykv::bench::product_chain
