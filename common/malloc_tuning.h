// Chunk traffic allocates and frees MiB-sized buffers (gRPC messages, fetched chunks).
// glibc serves large ones with fresh mmaps, and every use then pays page faults and
// zeroing: on the 2-core development machine that halved loopback get throughput
// (bench/cache_server_bench: 32 MiB chunks, 4 streams, 0.66 -> 1.5 GB/s). Serving all
// allocations from the heap, and trimming it rarely, lets freed buffers be reused. The
// cost: the heap keeps its high-water mark of transient buffers (bounded by the
// concurrent streams times the message size); the cache server's stored chunks live in
// its own mapped arena, not in the heap. Call once at the start of main().
#pragma once

#include <malloc.h>

namespace lazykv {

inline void TuneMallocForLargeBuffers() {
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

}  // namespace lazykv
