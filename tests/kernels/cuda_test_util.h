// Shared by the GPU tests: GPU presence, host/device copies (and an arena that frees them
// at the end of a test), and random bf16 inputs with their exact fp32 twins (the CPU
// reference's input).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace lazykv::testing {

inline bool HaveGpu() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

template <typename T>
T* ToDevice(const std::vector<T>& host) {
  T* device = nullptr;
  if (cudaMalloc(&device, std::max<size_t>(1, host.size()) * sizeof(T)) != cudaSuccess) return nullptr;
  cudaMemcpy(device, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  return device;
}

template <typename T>
std::vector<T> ToHost(const T* device, size_t n) {
  std::vector<T> host(n);
  cudaMemcpy(host.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost);
  return host;
}

// Device allocations that live until the end of a test: freed together on destruction.
class DeviceArena {
 public:
  DeviceArena() = default;
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;
  ~DeviceArena() {
    for (void* p : owned_) cudaFree(p);
  }

  template <typename T>
  T* Copy(const std::vector<T>& host) {
    return Own(ToDevice(host));
  }
  // n uninitialized elements.
  template <typename T>
  T* Alloc(size_t n) {
    T* device = nullptr;
    if (cudaMalloc(&device, std::max<size_t>(1, n) * sizeof(T)) != cudaSuccess) return nullptr;
    return Own(device);
  }

 private:
  template <typename T>
  T* Own(T* device) {
    if (device != nullptr) owned_.push_back(device);
    return device;
  }
  std::vector<void*> owned_;
};

inline void RandomBf16(std::mt19937_64& rng, size_t n, std::vector<__nv_bfloat16>& bf, std::vector<float>& fp) {
  std::normal_distribution<float> dist;
  bf.resize(n);
  fp.resize(n);
  for (size_t i = 0; i < n; ++i) {
    bf[i] = __float2bfloat16(dist(rng));
    fp[i] = __bfloat162float(bf[i]);
  }
}

// Random values of a storage element type (bf16 or fp32) and their exact fp32 twins.
inline void RandomElements(std::mt19937_64& rng, size_t n, std::vector<__nv_bfloat16>& stored, std::vector<float>& fp) {
  RandomBf16(rng, n, stored, fp);
}
inline void RandomElements(std::mt19937_64& rng, size_t n, std::vector<float>& stored, std::vector<float>& fp) {
  std::normal_distribution<float> dist;
  stored.resize(n);
  for (float& x : stored) x = dist(rng);
  fp = stored;
}

// Stored elements as fp32 (exact).
inline std::vector<float> AsFloat(const std::vector<__nv_bfloat16>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = __bfloat162float(v[i]);
  return out;
}
inline std::vector<float> AsFloat(std::vector<float> v) { return v; }

}  // namespace lazykv::testing
