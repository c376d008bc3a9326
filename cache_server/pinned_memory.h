// Page-locking host memory for fast GPU copies. Without CUDA (or without a device) this
// does nothing and says so; the cache tier works either way.
#pragma once

#include <cstddef>

namespace lazykv::cache {

// True when [base, base + bytes) is now pinned.
bool PinHostMemory(void* base, size_t bytes);
void UnpinHostMemory(void* base);
// For a read-only mapping (a worker's view of a cache server's shared arena:
// worker/tier/shm_arena_mapping.h): cudaHostRegisterReadOnly. Undone by UnpinHostMemory.
bool PinHostMemoryReadOnly(const void* base, size_t bytes);

}  // namespace lazykv::cache
