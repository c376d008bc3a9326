// Page-locking host memory for fast GPU copies. Without CUDA (or without a device) this
// does nothing and says so; the cache tier works either way.
#pragma once

#include <cstddef>

namespace lazykv::cache {

// True when [base, base + bytes) is now pinned.
bool PinHostMemory(void* base, size_t bytes);
void UnpinHostMemory(void* base);

}  // namespace lazykv::cache
