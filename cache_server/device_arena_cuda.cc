// The GPU tier's device memory on a GPU: one cudaMalloc, exported as a CUDA IPC handle.
#include <cuda_runtime.h>

#include <cstring>

#include "absl/strings/str_format.h"
#include "cache_server/device_arena.h"

namespace lazykv::cache {
namespace {

absl::Status CudaError(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrFormat("%s: %s", what, cudaGetErrorString(e)));
}

class CudaDeviceArena final : public DeviceArena {
 public:
  CudaDeviceArena(uint64_t page_bytes, uint64_t num_pages, int device, char* base, std::string handle,
                  std::string uuid)
      : DeviceArena(page_bytes, num_pages), device_(device), base_(base), handle_(std::move(handle)),
        uuid_(std::move(uuid)) {}
  ~CudaDeviceArena() override {
    cudaSetDevice(device_);
    cudaFree(base_);
  }
  absl::Status Write(std::span<const uint32_t> pages, uint64_t offset, std::string_view bytes) override {
    if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) return CudaError(e, "cudaSetDevice");
    absl::Status status;
    ForEachRun(pages, page_bytes(), offset, bytes.size(), [&](uint32_t page, uint64_t in_page, uint64_t at, uint64_t n) {
      if (!status.ok()) return;
      status = CudaError(cudaMemcpy(base_ + page * page_bytes() + in_page, bytes.data() + (at - offset), n,
                                    cudaMemcpyHostToDevice),
                         "GPU tier write");
    });
    // From pageable memory cudaMemcpy may return before the DMA lands: a reader in another
    // process must not see the pages before their bytes.
    if (status.ok()) status = CudaError(cudaDeviceSynchronize(), "GPU tier write");
    return status;
  }
  absl::Status Read(std::span<const uint32_t> pages, uint64_t offset, uint64_t length, char* out) const override {
    if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) return CudaError(e, "cudaSetDevice");
    absl::Status status;
    ForEachRun(pages, page_bytes(), offset, length, [&](uint32_t page, uint64_t in_page, uint64_t at, uint64_t n) {
      if (!status.ok()) return;
      status = CudaError(cudaMemcpy(out + (at - offset), base_ + page * page_bytes() + in_page, n,
                                    cudaMemcpyDeviceToHost),
                         "GPU tier read");
    });
    return status;
  }
  bool on_gpu() const override { return true; }
  int device() const override { return device_; }
  std::string ipc_handle() const override { return handle_; }
  std::string device_uuid() const override { return uuid_; }
  const char* base() const override { return base_; }

 private:
  const int device_;
  char* const base_;
  const std::string handle_;
  const std::string uuid_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceArena>> DeviceArena::CreateOnGpu(uint64_t capacity_bytes, uint64_t page_bytes,
                                                                      int device) {
  if (page_bytes == 0 || capacity_bytes < page_bytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("GPU tier of %d bytes holds no page of %d bytes", capacity_bytes, page_bytes));
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || device < 0 || device >= count) {
    cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrFormat("GPU tier: no GPU %d here (%d found)", device, count));
  }
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) return CudaError(e, "cudaSetDevice");
  const uint64_t num_pages = capacity_bytes / page_bytes;
  void* base = nullptr;
  if (cudaError_t e = cudaMalloc(&base, num_pages * page_bytes); e != cudaSuccess) {
    cudaGetLastError();
    return absl::ResourceExhaustedError(absl::StrFormat("GPU tier: %d bytes on GPU %d: %s", num_pages * page_bytes,
                                                        device, cudaGetErrorString(e)));
  }
  cudaIpcMemHandle_t handle;
  if (cudaError_t e = cudaIpcGetMemHandle(&handle, base); e != cudaSuccess) {
    cudaFree(base);
    return CudaError(e, "cudaIpcGetMemHandle");
  }
  cudaDeviceProp prop{};
  if (cudaError_t e = cudaGetDeviceProperties(&prop, device); e != cudaSuccess) {
    cudaFree(base);
    return CudaError(e, "cudaGetDeviceProperties");
  }
  return std::unique_ptr<DeviceArena>(new CudaDeviceArena(
      page_bytes, num_pages, device, static_cast<char*>(base),
      std::string(reinterpret_cast<const char*>(&handle), sizeof(handle)),
      std::string(reinterpret_cast<const char*>(&prop.uuid), sizeof(prop.uuid))));
}

}  // namespace lazykv::cache
