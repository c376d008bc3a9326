#include <cuda_runtime.h>

#include <array>
#include <atomic>

#include "kernels/cuda/device_info.h"

namespace lazykv::cuda {

int MultiprocessorCount() {
  constexpr int kMaxDevices = 64;
  static std::array<std::atomic<int>, kMaxDevices> cached{};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) return 132;
  int sms = cached[device].load(std::memory_order_relaxed);
  if (sms == 0) {
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) sms = 132;
    cached[device].store(sms, std::memory_order_relaxed);
  }
  return sms;
}

}  // namespace lazykv::cuda
