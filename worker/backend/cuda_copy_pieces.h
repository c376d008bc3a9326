// Host pieces to or from one device range in as few CUDA calls as it takes (the chunk
// transfer's copies, and the same-host fetch benchmark's).
#pragma once

#include <cuda_runtime.h>

#include <vector>

#include "absl/status/status.h"

namespace lazykv::cuda_backend {

// Copies between host pieces and one device range on `stream`, as few API calls as it
// takes: adjacent pieces are merged, and the rest go in one cudaMemcpyBatchAsync (a chunk
// in 256 KiB pages is hundreds of copies, whose one-by-one launches would cost more than
// the transfer). Falls back to one cudaMemcpyAsync per piece where batching is refused.
// Thread-safe (enqueues on `stream` only).
absl::Status CopyPieces(std::vector<void*> dsts, std::vector<const void*> srcs, std::vector<size_t> sizes,
                        cudaStream_t stream, const char* what);

}  // namespace lazykv::cuda_backend
