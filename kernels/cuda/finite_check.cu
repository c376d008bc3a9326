// Each thread tests 16-byte vectors (grid-stride); a vector holding a non-finite element
// reports that element's byte offset with atomicMin, so the first one wins whatever the
// schedule (finite_bits.cuh).
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/finite_bits.cuh"
#include "kernels/cuda/finite_check.h"

namespace lazykv::cuda {
namespace {

constexpr int kThreads = 256;

template <typename Bits>
__global__ void FindNonFiniteVectors(const uint4* data, uint64_t vectors, unsigned long long* first_bad) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t v = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; v < vectors; v += stride) {
    const uint4 vec = data[v];
    // A quick test of all the vector's elements before finding which one.
    const int at = FirstNonFiniteIn<Bits>(vec);
    if (at >= 0) atomicMin(first_bad, static_cast<unsigned long long>(v * 16 + at));
  }
}

template <typename Bits>
__global__ void FindNonFiniteElements(const Bits* data, uint64_t begin, uint64_t count, unsigned long long* first_bad) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = begin + static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    if (NonFinite(data[i])) atomicMin(first_bad, static_cast<unsigned long long>(i * sizeof(Bits)));
  }
}

int GridFor(uint64_t items) {
  const int sms = MultiprocessorCount();
  const uint64_t wanted = (items + kThreads - 1) / kThreads;
  return static_cast<int>(std::max<uint64_t>(1, std::min<uint64_t>(wanted, static_cast<uint64_t>(sms) * 8)));
}

template <typename Bits>
void Launch(const void* data, uint64_t bytes, unsigned long long* first_bad, cudaStream_t stream) {
  const uint64_t elements = bytes / sizeof(Bits);
  uint64_t vector_elements = 0;
  if (reinterpret_cast<uintptr_t>(data) % 16 == 0) {
    const uint64_t vectors = bytes / 16;
    vector_elements = vectors * 16 / sizeof(Bits);
    if (vectors > 0) {
      FindNonFiniteVectors<Bits>
          <<<GridFor(vectors), kThreads, 0, stream>>>(static_cast<const uint4*>(data), vectors, first_bad);
    }
  }
  if (vector_elements < elements) {  // the tail after the last whole vector, or all of an unaligned payload
    FindNonFiniteElements<Bits><<<GridFor(elements - vector_elements), kThreads, 0, stream>>>(
        static_cast<const Bits*>(data), vector_elements, elements, first_bad);
  }
}

}  // namespace

cudaError_t LaunchFindNonFinite(const void* data, uint64_t bytes, Element element, unsigned long long* first_bad,
                                cudaStream_t stream) {
  const size_t size = ElementBytes(element);
  if (first_bad == nullptr || bytes % size != 0 || (bytes > 0 && data == nullptr) ||
      reinterpret_cast<uintptr_t>(data) % size != 0) {
    return cudaErrorInvalidValue;
  }
  if (cudaError_t e = cudaMemsetAsync(first_bad, 0xFF, sizeof(*first_bad), stream); e != cudaSuccess) return e;
  if (bytes == 0) return cudaSuccess;
  if (element == Element::kBf16) {
    Launch<uint16_t>(data, bytes, first_bad, stream);
  } else {
    Launch<uint32_t>(data, bytes, first_bad, stream);
  }
  return cudaGetLastError();
}

}  // namespace lazykv::cuda
