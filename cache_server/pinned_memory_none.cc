#include "cache_server/pinned_memory.h"

namespace lazykv::cache {

bool PinHostMemory(void*, size_t) { return false; }
bool PinHostMemoryReadOnly(const void*, size_t) { return false; }
void UnpinHostMemory(void*) {}

}  // namespace lazykv::cache
