#include <cuda_bf16.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cfloat>

#include "kernels/cuda/lazy_decode_attention.h"
#include "kernels/cuda/rope_device.cuh"

namespace lazykv::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kMaxGroup = 8;  // query heads per KV head handled by one CTA

// Partial results of one split: running max, running sum, unnormalized output.
struct PartialView {
  float* m;
  float* l;
  float* acc;
  __device__ size_t index(int seq, int head, int split, int n_heads, int splits) const {
    return (static_cast<size_t>(seq) * n_heads + head) * splits + split;
  }
};

__device__ PartialView Partials(float* workspace, int num_seqs, int n_heads, int splits) {
  const size_t n = static_cast<size_t>(num_seqs) * n_heads * splits;
  return PartialView{workspace, workspace + n, workspace + 2 * n};
}

// One CTA: one sequence, one KV head (all its query heads), one split of the block table.
template <int HD>
__global__ void __launch_bounds__(kThreads) DecodeSplitKernel(DecodeAttentionParams p, int entries_per_split) {
  constexpr int E = HD / 32;  // dimensions per lane
  const int seq = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z;
  const int group = p.n_heads / p.n_kv_heads;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int first = p.table_offsets[seq] + split * entries_per_split;
  const int last = min(p.table_offsets[seq + 1], first + entries_per_split);
  const int position = p.positions[seq];
  const float scale = rsqrtf(static_cast<float>(HD));

  __shared__ float q_raw[kMaxGroup * HD];
  __shared__ float warp_m[kWarps][kMaxGroup], warp_l[kWarps][kMaxGroup];
  __shared__ float warp_acc[kWarps][kMaxGroup][HD];

  for (int i = threadIdx.x; i < group * HD; i += kThreads) {
    q_raw[i] = p.q[(static_cast<size_t>(seq) * p.n_heads + kvh * group) * HD + i];
  }
  __syncthreads();  // q_raw is read-only from here on

  float m[kMaxGroup], l[kMaxGroup], acc[kMaxGroup][E], q[kMaxGroup][E];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    m[g] = -FLT_MAX;
    l[g] = 0.0f;
#pragma unroll
    for (int e = 0; e < E; ++e) acc[g][e] = 0.0f;
  }

  const __nv_bfloat16* k_pool = static_cast<const __nv_bfloat16*>(p.k_pool);
  const __nv_bfloat16* v_pool = static_cast<const __nv_bfloat16*>(p.v_pool);
  bool rotated = false;
  int rotated_delta = 0;
  for (int entry = first; entry < last; ++entry) {
    const int delta = p.block_deltas[entry];
    if (!rotated || delta != rotated_delta) {
      // Each warp rotates its own registers from the raw query in shared memory (written
      // once before the loop): no barrier, so other warps' loads stay in flight.
#pragma unroll
      for (int e = 0; e < E; ++e) {
        const int d = lane * E + e;
        const bool interleaved = p.rope_style == 0;
        const int freq = interleaved ? d / 2 : d % (HD / 2);
        const int partner = interleaved ? (d ^ 1) : (d < HD / 2 ? d + HD / 2 : d - HD / 2);
        const bool first_of_pair = interleaved ? (d % 2 == 0) : (d < HD / 2);
        float sn, cs;
        RopeSinCos(p.inv_freq[freq], static_cast<long long>(position) - delta, &sn, &cs);
        const float signed_sin = first_of_pair ? -sn : sn;
#pragma unroll
        for (int g = 0; g < kMaxGroup; ++g) {
          q[g][e] = g < group ? (q_raw[g * HD + d] * cs + q_raw[g * HD + partner] * signed_sin) * scale : 0.0f;
        }
      }
      rotated = true;
      rotated_delta = delta;
    }
    const int block = p.block_ids[entry];
    const int visible = min(p.block_tokens[entry], position - p.block_starts[entry] + 1);
    // Two tokens per warp iteration: both tokens' loads are issued before the math.
    for (int t0 = warp; t0 < visible; t0 += 2 * kWarps) {
      float k[2][E], v[2][E];
      const int count = t0 + kWarps < visible ? 2 : 1;
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        if (u >= count) break;
        const int t = t0 + u * kWarps;
        const size_t offset = ((static_cast<size_t>(block) * p.block_size + t) * p.n_kv_heads + kvh) * HD + lane * E;
#pragma unroll
        for (int e = 0; e < E; e += 2) {
          const float2 kk = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(k_pool + offset + e));
          const float2 vv = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(v_pool + offset + e));
          k[u][e] = kk.x;
          k[u][e + 1] = kk.y;
          v[u][e] = vv.x;
          v[u][e + 1] = vv.y;
        }
      }
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        if (u >= count) break;
#pragma unroll
        for (int g = 0; g < kMaxGroup; ++g) {
          if (g >= group) break;
          float s = 0.0f;
#pragma unroll
          for (int e = 0; e < E; ++e) s += q[g][e] * k[u][e];
#pragma unroll
          for (int offset_lane = 16; offset_lane > 0; offset_lane /= 2) s += __shfl_xor_sync(0xffffffffu, s, offset_lane);
          const float m_new = fmaxf(m[g], s);
          const float correction = __expf(m[g] - m_new);
          const float weight = __expf(s - m_new);
          l[g] = l[g] * correction + weight;
#pragma unroll
          for (int e = 0; e < E; ++e) acc[g][e] = acc[g][e] * correction + weight * v[u][e];
          m[g] = m_new;
        }
      }
    }
  }

  // Merge the warps' running states, then write this split's partial.
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    if (g >= group) break;
    if (lane == 0) {
      warp_m[warp][g] = m[g];
      warp_l[warp][g] = l[g];
    }
#pragma unroll
    for (int e = 0; e < E; ++e) warp_acc[warp][g][lane * E + e] = acc[g][e];
  }
  __syncthreads();
  const PartialView part = Partials(p.workspace, p.num_seqs, p.n_heads, gridDim.z);
  for (int idx = threadIdx.x; idx < group * HD; idx += kThreads) {
    const int g = idx / HD, d = idx % HD;
    float m_all = -FLT_MAX;
    for (int w = 0; w < kWarps; ++w) m_all = fmaxf(m_all, warp_m[w][g]);
    float l_all = 0.0f, a_all = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      const float f = warp_l[w][g] > 0.0f ? __expf(warp_m[w][g] - m_all) : 0.0f;
      l_all += f * warp_l[w][g];
      a_all += f * warp_acc[w][g][d];
    }
    const size_t i = part.index(seq, kvh * group + g, split, p.n_heads, gridDim.z);
    part.acc[i * HD + d] = a_all;
    if (d == 0) {
      part.m[i] = m_all;
      part.l[i] = l_all;
    }
  }
}

// One CTA per (sequence, query head): merges the splits.
__global__ void CombineSplitsKernel(DecodeAttentionParams p, int splits) {
  const int seq = blockIdx.x / p.n_heads, head = blockIdx.x % p.n_heads;
  const PartialView part = Partials(p.workspace, p.num_seqs, p.n_heads, splits);
  const size_t base = part.index(seq, head, 0, p.n_heads, splits);
  float m_all = -FLT_MAX;
  for (int s = 0; s < splits; ++s) {
    if (part.l[base + s] > 0.0f) m_all = fmaxf(m_all, part.m[base + s]);
  }
  for (int d = threadIdx.x; d < p.head_dim; d += blockDim.x) {
    float l_all = 0.0f, a_all = 0.0f;
    for (int s = 0; s < splits; ++s) {
      if (part.l[base + s] <= 0.0f) continue;
      const float f = __expf(part.m[base + s] - m_all);
      l_all += f * part.l[base + s];
      a_all += f * part.acc[(base + s) * p.head_dim + d];
    }
    p.out[(static_cast<size_t>(seq) * p.n_heads + head) * p.head_dim + d] = l_all > 0.0f ? a_all / l_all : 0.0f;
  }
}

__global__ void MaterializeKernel(MaterializeParams p) {
  const int copy = blockIdx.x;
  const int src = p.src_blocks[copy], dst = p.dst_blocks[copy], n = p.num_tokens[copy], delta = p.deltas[copy];
  const int hd = p.head_dim, half = hd / 2;
  __nv_bfloat16* k = static_cast<__nv_bfloat16*>(p.k_pool);
  __nv_bfloat16* v = static_cast<__nv_bfloat16*>(p.v_pool);
  const size_t slot_width = static_cast<size_t>(p.n_kv_heads) * hd;
  const size_t src_base = static_cast<size_t>(src) * p.block_size * slot_width;
  const size_t dst_base = static_cast<size_t>(dst) * p.block_size * slot_width;
  for (int idx = threadIdx.x; idx < n * p.n_kv_heads * half; idx += blockDim.x) {
    const int i = idx % half, row = idx / half;  // row = slot * n_kv_heads + head
    int a, b;
    RopePair(p.rope_style, hd, i, &a, &b);
    float s, c;
    RopeSinCos(p.inv_freq[i], delta, &s, &c);
    const size_t r = static_cast<size_t>(row) * hd;
    const float x0 = __bfloat162float(k[src_base + r + a]), x1 = __bfloat162float(k[src_base + r + b]);
    k[dst_base + r + a] = __float2bfloat16(x0 * c - x1 * s);
    k[dst_base + r + b] = __float2bfloat16(x0 * s + x1 * c);
  }
  for (size_t idx = threadIdx.x; idx < static_cast<size_t>(n) * slot_width; idx += blockDim.x) {
    v[dst_base + idx] = v[src_base + idx];
  }
}

}  // namespace

namespace {

// The SM count of each device, asked once: this runs per layer per decode step.
int MultiprocessorCount() {
  constexpr int kMaxDevices = 64;
  static std::array<std::atomic<int>, kMaxDevices> cached{};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) return 132;
  int sms = cached[device].load(std::memory_order_relaxed);
  if (sms == 0) {
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) sms = 132;
    cached[device].store(sms, std::memory_order_relaxed);
  }
  return sms;
}

}  // namespace

int ChooseDecodeSplits(const DecodeAttentionParams& p) {
  if (p.num_splits > 0) return std::min(p.num_splits, std::max(1, p.max_entries_per_seq));
  const int sms = MultiprocessorCount();
  const int ctas = std::max(1, p.num_seqs * p.n_kv_heads);
  const int wanted = (2 * sms + ctas - 1) / ctas;  // about two CTAs per SM
  // Each split should still cover a few blocks, or the partials cost more than they save.
  return std::max(1, std::min(wanted, (p.max_entries_per_seq + 3) / 4));
}

size_t DecodeWorkspaceBytes(const DecodeAttentionParams& p, int num_splits) {
  return static_cast<size_t>(p.num_seqs) * p.n_heads * num_splits * (p.head_dim + 2) * sizeof(float);
}

cudaError_t LaunchLazyDecodeAttention(DecodeAttentionParams p, cudaStream_t stream) {
  if (p.num_seqs <= 0 || p.n_kv_heads <= 0 || p.n_heads % p.n_kv_heads != 0 ||
      p.n_heads / p.n_kv_heads > kMaxGroup || (p.head_dim != 64 && p.head_dim != 128) || p.block_size <= 0 ||
      p.max_entries_per_seq < 0) {
    return cudaErrorInvalidValue;
  }
  const int splits = ChooseDecodeSplits(p);
  const int entries_per_split = std::max(1, (p.max_entries_per_seq + splits - 1) / splits);
  const dim3 grid(p.num_seqs, p.n_kv_heads, splits);
  if (p.head_dim == 64) {
    DecodeSplitKernel<64><<<grid, kThreads, 0, stream>>>(p, entries_per_split);
  } else {
    DecodeSplitKernel<128><<<grid, kThreads, 0, stream>>>(p, entries_per_split);
  }
  CombineSplitsKernel<<<p.num_seqs * p.n_heads, 128, 0, stream>>>(p, splits);
  return cudaGetLastError();
}

cudaError_t LaunchMaterialize(const MaterializeParams& p, cudaStream_t stream) {
  if (p.num_copies == 0) return cudaSuccess;
  if (p.num_copies < 0 || p.head_dim % 2 != 0 || p.block_size <= 0) return cudaErrorInvalidValue;
  MaterializeKernel<<<p.num_copies, 256, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace lazykv::cuda
