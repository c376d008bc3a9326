#include "common/device_mapped_regions.h"

#include <map>

#include "common/mutex.h"

namespace lazykv {
namespace {

struct Registry {
  Mutex mu;
  std::map<const char*, DeviceMappedRegion> by_base ABSL_GUARDED_BY(mu);
};

Registry& TheRegistry() {
  static Registry* registry = new Registry();  // never destroyed: used until exit
  return *registry;
}

}  // namespace

void RegisterDeviceMappedRegion(const void* base, size_t bytes, const void* device_base, bool writable) {
  Registry& r = TheRegistry();
  MutexLock lock(&r.mu);
  const char* b = static_cast<const char*>(base);
  r.by_base[b] = DeviceMappedRegion{
      .base = b, .bytes = bytes, .device_base = static_cast<const char*>(device_base), .writable = writable};
}

void UnregisterDeviceMappedRegion(const void* base) {
  Registry& r = TheRegistry();
  MutexLock lock(&r.mu);
  r.by_base.erase(static_cast<const char*>(base));
}

std::optional<DeviceMappedRegion> FindDeviceMappedRegion(const void* p, size_t n) {
  Registry& r = TheRegistry();
  MutexLock lock(&r.mu);
  auto it = r.by_base.upper_bound(static_cast<const char*>(p));
  if (it == r.by_base.begin()) return std::nullopt;
  --it;  // the region starting at or before p
  if (!it->second.Contains(p, n)) return std::nullopt;
  return it->second;
}

}  // namespace lazykv
