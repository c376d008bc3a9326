#include "worker/backend/cuda_copy_pieces.h"

#include "worker/backend/cuda_backend_internal.h"  // Cuda()

namespace lazykv::cuda_backend {

absl::Status CopyPieces(std::vector<void*> dsts, std::vector<const void*> srcs, std::vector<size_t> sizes,
                        cudaStream_t stream, const char* what) {
  size_t n = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == 0) continue;
    if (n > 0 && static_cast<char*>(dsts[n - 1]) + sizes[n - 1] == dsts[i] &&
        static_cast<const char*>(srcs[n - 1]) + sizes[n - 1] == srcs[i]) {
      sizes[n - 1] += sizes[i];
      continue;
    }
    dsts[n] = dsts[i];
    srcs[n] = srcs[i];
    sizes[n] = sizes[i];
    ++n;
  }
  if (n == 0) return absl::OkStatus();
  if (n > 1) {
    cudaMemcpyAttributes attributes{};
    attributes.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attributes.flags = cudaMemcpyFlagPreferOverlapWithCompute;
    size_t attribute_index = 0;
    if (cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), n, &attributes, &attribute_index, 1, stream) ==
        cudaSuccess) {
      return absl::OkStatus();
    }
    cudaGetLastError();  // not supported here: one by one
  }
  for (size_t i = 0; i < n; ++i) {
    RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(dsts[i], srcs[i], sizes[i], cudaMemcpyDefault, stream), what));
  }
  return absl::OkStatus();
}

}  // namespace lazykv::cuda_backend
