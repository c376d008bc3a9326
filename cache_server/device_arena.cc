// The device arena's page allocator and its emulated (host memory) form; the GPU form is
// in device_arena_cuda.cc (device_arena_none.cc in a build without CUDA).
#include "cache_server/device_arena.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_format.h"

namespace lazykv::cache {
namespace {

class EmulatedDeviceArena final : public DeviceArena {
 public:
  EmulatedDeviceArena(uint64_t page_bytes, uint64_t num_pages)
      : DeviceArena(page_bytes, num_pages), memory_(page_bytes * num_pages) {}
  absl::Status Write(std::span<const uint32_t> pages, uint64_t offset, std::string_view bytes) override {
    ForEachRun(pages, page_bytes(), offset, bytes.size(), [&](uint32_t page, uint64_t in_page, uint64_t at, uint64_t n) {
      std::memcpy(memory_.data() + page * page_bytes() + in_page, bytes.data() + (at - offset), n);
    });
    return absl::OkStatus();
  }
  absl::Status Read(std::span<const uint32_t> pages, uint64_t offset, uint64_t length, char* out) const override {
    ForEachRun(pages, page_bytes(), offset, length, [&](uint32_t page, uint64_t in_page, uint64_t at, uint64_t n) {
      std::memcpy(out + (at - offset), memory_.data() + page * page_bytes() + in_page, n);
    });
    return absl::OkStatus();
  }
  bool on_gpu() const override { return false; }
  int device() const override { return -1; }
  std::string ipc_handle() const override { return {}; }
  std::string device_uuid() const override { return {}; }
  const char* base() const override { return memory_.data(); }

 private:
  std::vector<char> memory_;
};

}  // namespace

DeviceArena::DeviceArena(uint64_t page_bytes, uint64_t num_pages) : page_bytes_(page_bytes), num_pages_(num_pages) {
  is_free_.assign(num_pages, true);
  free_count_ = num_pages;
}

absl::StatusOr<std::unique_ptr<DeviceArena>> DeviceArena::CreateEmulated(uint64_t capacity_bytes,
                                                                         uint64_t page_bytes) {
  if (page_bytes == 0 || capacity_bytes < page_bytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("GPU tier of %d bytes holds no page of %d bytes", capacity_bytes, page_bytes));
  }
  return std::unique_ptr<DeviceArena>(new EmulatedDeviceArena(page_bytes, capacity_bytes / page_bytes));
}

bool DeviceArena::TryAllocate(uint64_t n, std::vector<uint32_t>* pages) {
  MutexLock lock(&mu_);
  if (free_count_ < n) return false;
  pages->clear();
  pages->reserve(n);
  // First fit of a run of n adjacent free pages: one pass over the page map (thousands of
  // pages, a few microseconds, beside a copy of megabytes).
  uint64_t run = 0;
  for (uint64_t p = 0; p < num_pages_ && n > 0; ++p) {
    run = is_free_[p] ? run + 1 : 0;
    if (run == n) {
      for (uint64_t q = p + 1 - n; q <= p; ++q) pages->push_back(static_cast<uint32_t>(q));
      break;
    }
  }
  if (pages->size() < n) {  // no run that long: the lowest free pages, ascending
    pages->clear();
    for (uint64_t p = 0; p < num_pages_ && pages->size() < n; ++p) {
      if (is_free_[p]) pages->push_back(static_cast<uint32_t>(p));
    }
  }
  for (uint32_t page : *pages) is_free_[page] = false;
  free_count_ -= n;
  return true;
}

void DeviceArena::Free(std::span<const uint32_t> pages) {
  MutexLock lock(&mu_);
  for (uint32_t page : pages) {
    if (page < num_pages_ && !is_free_[page]) {
      is_free_[page] = true;
      ++free_count_;
    }
  }
}

uint64_t DeviceArena::free_pages() const {
  MutexLock lock(&mu_);
  return free_count_;
}

}  // namespace lazykv::cache
