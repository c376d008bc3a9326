#include <cuda_runtime.h>

#include "cache_server/pinned_memory.h"

namespace lazykv::cache {

bool PinHostMemory(void* base, size_t bytes) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    cudaGetLastError();  // clear the sticky "no device" error
    return false;
  }
  return cudaHostRegister(base, bytes, cudaHostRegisterPortable) == cudaSuccess;
}

bool PinHostMemoryReadOnly(const void* base, size_t bytes) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    cudaGetLastError();
    return false;
  }
  return cudaHostRegister(const_cast<void*>(base), bytes, cudaHostRegisterPortable | cudaHostRegisterReadOnly) ==
         cudaSuccess;
}

void UnpinHostMemory(void* base) { cudaHostUnregister(base); }

}  // namespace lazykv::cache
