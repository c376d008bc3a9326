// Host memory this process page-locked for the GPU, with the address a device reads it at
// (cache_server/pinned_memory.h registers each region it pins, and removes it before unpinning).
// The chunk transfer asks here before it asks the driver: a chunk in the cache tier's arena
// is hundreds of pages of one region, and a driver query per page costs as much as 3% of
// the chunk's copy (worker/backend/cuda_copy_pieces.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

namespace lazykv {

// A registered region: host [base, base + bytes) reads at device_base on the device.
struct DeviceMappedRegion {
  const char* base = nullptr;
  size_t bytes = 0;
  const char* device_base = nullptr;
  bool writable = true;  // false for a read-only mapping: a device write there would fault

  bool Contains(const void* p, size_t n) const {
    const char* c = static_cast<const char*>(p);
    return c >= base && n <= bytes && static_cast<size_t>(c - base) <= bytes - n;
  }
  const char* DeviceAddress(const void* p) const { return device_base + (static_cast<const char*>(p) - base); }
};

// Thread-safe. Regions must not overlap. Remove a region before the memory is unpinned or
// unmapped; a caller that found it may use it only while it keeps the memory alive.
void RegisterDeviceMappedRegion(const void* base, size_t bytes, const void* device_base, bool writable);
void UnregisterDeviceMappedRegion(const void* base);
// The registered region holding all of [p, p + n), if one does.
std::optional<DeviceMappedRegion> FindDeviceMappedRegion(const void* p, size_t n);

}  // namespace lazykv
