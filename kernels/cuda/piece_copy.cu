// Each CTA copies whole segments in 16-byte vectors, kUnroll loads in flight per thread
// before their stores (a load from host memory waits a PCIe round trip; many in flight
// hide it). A segment's last bytes that are not a whole vector (only the plan's last
// segment has them) go element by element, or byte by byte when nothing is checked.
#include "kernels/cuda/finite_bits.cuh"
#include "kernels/cuda/piece_copy.h"

// The inline launch's parameters (5 KiB) need the 32 KiB parameter space of CUDA 12.1.
static_assert(CUDART_VERSION >= 12010, "LaunchPieceCopyInline needs CUDA 12.1 or later");

namespace lazykv::cuda {
namespace {

constexpr int kUnroll = 4;

// One segment by the calling CTA.
template <typename Bits, bool kCheck>
__device__ __forceinline__ void CopySegmentBy(const CopySegment& seg, unsigned long long* first_bad) {
  const uint4* src = reinterpret_cast<const uint4*>(seg.src);
  uint4* dst = reinterpret_cast<uint4*>(seg.dst);
  const uint32_t vectors = seg.bytes / 16;
  for (uint32_t base = 0; base < vectors; base += blockDim.x * kUnroll) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const uint32_t i = base + u * blockDim.x + threadIdx.x;
      if (i < vectors) v[u] = src[i];
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const uint32_t i = base + u * blockDim.x + threadIdx.x;
      if (i < vectors) {
        if constexpr (kCheck) {
          const int at = FirstNonFiniteIn<Bits>(v[u]);
          if (at >= 0) atomicMin(first_bad, static_cast<unsigned long long>(seg.offset + i * 16ull + at));
        }
        dst[i] = v[u];
      }
    }
  }
  // The last bytes: whole elements when checking (the plan's rules make them so), else bytes.
  const uint32_t tail_bytes = seg.bytes - vectors * 16;
  if constexpr (kCheck) {
    if (threadIdx.x < tail_bytes / sizeof(Bits)) {
      const uint64_t at = vectors * 16ull + threadIdx.x * sizeof(Bits);
      const Bits e = *reinterpret_cast<const Bits*>(seg.src + at);
      if (NonFinite(e)) atomicMin(first_bad, static_cast<unsigned long long>(seg.offset + at));
      *reinterpret_cast<Bits*>(seg.dst + at) = e;
    }
  } else if (threadIdx.x < tail_bytes) {
    const uint64_t at = vectors * 16ull + threadIdx.x;
    *reinterpret_cast<char*>(seg.dst + at) = *reinterpret_cast<const char*>(seg.src + at);
  }
}

template <typename Bits, bool kCheck>
__global__ void PieceCopyKernel(const CopySegment* segments, int num_segments, unsigned long long* first_bad) {
  for (int s = blockIdx.x; s < num_segments; s += gridDim.x) CopySegmentBy<Bits, kCheck>(segments[s], first_bad);
}

struct InlineSegments {
  CopySegment segment[kInlineCopySegments];
};

// The segments read from the launch's parameters in place (__grid_constant__: no copy per thread).
// With `ctas_done` non-null the answer is published (PublishedAnswer): each CTA counts itself
// done after its checks, and the last one moves the answer to `published` and resets both.
template <typename Bits, bool kCheck>
__global__ void PieceCopyInlineKernel(const __grid_constant__ InlineSegments segments, int num_segments,
                                      unsigned long long* first_bad, unsigned int* ctas_done,
                                      unsigned long long* published) {
  for (int s = blockIdx.x; s < num_segments; s += gridDim.x) {
    CopySegmentBy<Bits, kCheck>(segments.segment[s], first_bad);
  }
  if constexpr (kCheck) {
    if (ctas_done == nullptr) return;
    __syncthreads();  // every thread's atomicMin is done
    if (threadIdx.x == 0) {
      __threadfence();
      if (atomicAdd(ctas_done, 1u) == gridDim.x - 1) {
        __threadfence();
        const unsigned long long answer = atomicExch(first_bad, ~0ull);
        *ctas_done = 0;
        *reinterpret_cast<volatile unsigned long long*>(published) = answer;
        __threadfence_system();
      }
    }
  }
}

template <typename Bits>
void Launch(const CopySegment* segments, int num_segments, unsigned long long* first_bad, cudaStream_t stream,
            PieceCopyLaunch launch) {
  const int grid = num_segments < launch.max_ctas ? num_segments : launch.max_ctas;
  if (first_bad != nullptr) {
    PieceCopyKernel<Bits, true><<<grid, launch.threads, 0, stream>>>(segments, num_segments, first_bad);
  } else {
    PieceCopyKernel<Bits, false><<<grid, launch.threads, 0, stream>>>(segments, num_segments, first_bad);
  }
}

template <typename Bits>
void LaunchInlineAs(const InlineSegments& segments, int num_segments, unsigned long long* first_bad,
                    unsigned int* ctas_done, unsigned long long* published, cudaStream_t stream,
                    PieceCopyLaunch launch) {
  const int grid = num_segments < launch.max_ctas ? num_segments : launch.max_ctas;
  if (first_bad != nullptr) {
    PieceCopyInlineKernel<Bits, true>
        <<<grid, launch.threads, 0, stream>>>(segments, num_segments, first_bad, ctas_done, published);
  } else {
    PieceCopyInlineKernel<Bits, false>
        <<<grid, launch.threads, 0, stream>>>(segments, num_segments, first_bad, ctas_done, published);
  }
}

// Both inline launches: 1..kInlineCopySegments segments copied into the parameters.
cudaError_t LaunchInline(const CopySegment* host_segments, int num_segments, Element element,
                         unsigned long long* first_bad, unsigned int* ctas_done, unsigned long long* published,
                         cudaStream_t stream, PieceCopyLaunch launch) {
  InlineSegments segments;
  for (int i = 0; i < num_segments; ++i) segments.segment[i] = host_segments[i];
  if (element == Element::kBf16) {
    LaunchInlineAs<uint16_t>(segments, num_segments, first_bad, ctas_done, published, stream, launch);
  } else {
    LaunchInlineAs<uint32_t>(segments, num_segments, first_bad, ctas_done, published, stream, launch);
  }
  return cudaGetLastError();
}

bool BadLaunch(PieceCopyLaunch launch) {
  return launch.max_ctas < 1 || launch.threads < 32 || launch.threads > 1024 || launch.threads % 32 != 0;
}

}  // namespace

cudaError_t LaunchPieceCopy(const CopySegment* segments, int num_segments, Element element,
                            unsigned long long* first_bad, cudaStream_t stream, PieceCopyLaunch launch) {
  if (num_segments < 0 || (num_segments > 0 && segments == nullptr) || BadLaunch(launch)) return cudaErrorInvalidValue;
  if (first_bad != nullptr) {
    if (cudaError_t e = cudaMemsetAsync(first_bad, 0xFF, sizeof(*first_bad), stream); e != cudaSuccess) return e;
  }
  if (num_segments == 0) return cudaSuccess;
  if (element == Element::kBf16) {
    Launch<uint16_t>(segments, num_segments, first_bad, stream, launch);
  } else {
    Launch<uint32_t>(segments, num_segments, first_bad, stream, launch);
  }
  return cudaGetLastError();
}

cudaError_t LaunchPieceCopyInline(const CopySegment* host_segments, int num_segments, Element element,
                                  unsigned long long* first_bad, cudaStream_t stream, PieceCopyLaunch launch) {
  if (num_segments < 0 || num_segments > kInlineCopySegments || (num_segments > 0 && host_segments == nullptr) ||
      BadLaunch(launch)) {
    return cudaErrorInvalidValue;
  }
  if (first_bad != nullptr) {
    if (cudaError_t e = cudaMemsetAsync(first_bad, 0xFF, sizeof(*first_bad), stream); e != cudaSuccess) return e;
  }
  if (num_segments == 0) return cudaSuccess;
  return LaunchInline(host_segments, num_segments, element, first_bad, nullptr, nullptr, stream, launch);
}

cudaError_t LaunchPieceCopyInlinePublished(const CopySegment* host_segments, int num_segments, Element element,
                                           const PublishedAnswer& answer, cudaStream_t stream, PieceCopyLaunch launch) {
  if (num_segments < 1 || num_segments > kInlineCopySegments || host_segments == nullptr || BadLaunch(launch) ||
      answer.first_bad == nullptr || answer.ctas_done == nullptr || answer.published == nullptr) {
    return cudaErrorInvalidValue;
  }
  return LaunchInline(host_segments, num_segments, element, answer.first_bad, answer.ctas_done, answer.published,
                      stream, launch);
}

}  // namespace lazykv::cuda
