// cuda_backend_bench's chunk transfer measures (cuda_chunk_transfer_bench.cc).
#pragma once

#include "worker/backend/backend.h"

namespace lazykv::bench {

// Prints the transfer ceilings and the chunk import, export and materialize figures of
// `backend` (a CUDA backend of synthetic:llama3-8b); returns the HBM traffic rate of a
// device-to-device copy (read + write, GB/s), the decode figures' floor. Exits on any error.
double ChunkTransferBench(Backend& backend);

}  // namespace lazykv::bench
