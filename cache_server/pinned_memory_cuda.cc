#include <cuda_runtime.h>

#include "cache_server/pinned_memory.h"
#include "common/device_mapped_regions.h"

namespace lazykv::cache {
namespace {

// Registers a pinned region with the address the current device reads it at (the chunk
// transfer's kernel reads such pages in place). Unified addressing maps it at once; where
// the driver gives no device address, nothing is registered and copies ask per piece.
void Register(const void* base, size_t bytes, bool writable) {
  void* device = nullptr;
  if (cudaHostGetDevicePointer(&device, const_cast<void*>(base), 0) != cudaSuccess || device == nullptr) {
    cudaGetLastError();
    return;
  }
  RegisterDeviceMappedRegion(base, bytes, device, writable);
}

// Page-locks [base, base + bytes) with `flags` and registers it; false without a device or
// when the driver refuses.
bool Pin(const void* base, size_t bytes, unsigned flags, bool writable) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    cudaGetLastError();  // clear the sticky "no device" error
    return false;
  }
  if (cudaHostRegister(const_cast<void*>(base), bytes, flags) != cudaSuccess) return false;
  Register(base, bytes, writable);
  return true;
}

}  // namespace

bool PinHostMemory(void* base, size_t bytes) { return Pin(base, bytes, cudaHostRegisterPortable, /*writable=*/true); }

bool PinHostMemoryReadOnly(const void* base, size_t bytes) {
  return Pin(base, bytes, cudaHostRegisterPortable | cudaHostRegisterReadOnly, /*writable=*/false);
}

void UnpinHostMemory(void* base) {
  UnregisterDeviceMappedRegion(base);  // before the pages stop being mapped
  cudaHostUnregister(base);
}

}  // namespace lazykv::cache
