// CudaIpcMapping on a CUDA build: cudaIpcOpenMemHandle on the worker's GPU.
#include <cuda_runtime.h>
#include <spdlog/spdlog.h>

#include <cstring>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "common/mutex.h"
#include "worker/tier/cuda_ipc_mapping.h"

namespace lazykv {

absl::StatusOr<std::shared_ptr<const CudaIpcMapping>> CudaIpcMapping::Open(std::string_view handle,
                                                                           std::string_view device_uuid, int device,
                                                                           uint64_t region_bytes, uint64_t page_bytes) {
  if (handle.size() != sizeof(cudaIpcMemHandle_t) || device_uuid.size() != sizeof(cudaUUID_t)) {
    return absl::InvalidArgumentError("GPU tier: malformed IPC handle or device UUID");
  }
  if (page_bytes == 0 || region_bytes < page_bytes) {
    return absl::InvalidArgumentError("GPU tier: malformed geometry (page larger than the region)");
  }
  // A process may open a handle once while it is open: a second session to the same server
  // (the first one's chunks still held) shares the mapping.
  static Mutex opened_mu;
  static absl::flat_hash_map<std::string, std::weak_ptr<const CudaIpcMapping>> opened;
  MutexLock lock(&opened_mu);
  const std::string key = std::to_string(device) + ":" + std::string(handle);
  if (auto it = opened.find(key); it != opened.end()) {
    if (std::shared_ptr<const CudaIpcMapping> live = it->second.lock()) {
      if (live->bytes() == region_bytes && live->page_bytes() == page_bytes) return live;
      return absl::InvalidArgumentError("GPU tier: the same handle with another geometry");
    }
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || device < 0 || device >= count) {
    cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrFormat("GPU tier: no GPU %d in this process", device));
  }
  int owner = -1;  // the server's GPU, as this process numbers them
  for (int d = 0; d < count && owner < 0; ++d) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, d) == cudaSuccess &&
        std::memcmp(&prop.uuid, device_uuid.data(), sizeof(cudaUUID_t)) == 0) {
      owner = d;
    }
  }
  if (owner < 0) return absl::FailedPreconditionError("GPU tier: the server's GPU is not visible from this process");
  const bool peer = owner != device;
  if (peer) {
    int can = 0;
    if (cudaDeviceCanAccessPeer(&can, device, owner) != cudaSuccess || can == 0) {
      cudaGetLastError();
      return absl::FailedPreconditionError(
          absl::StrFormat("GPU tier: on GPU %d, which GPU %d has no peer access to", owner, device));
    }
  }
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
    return absl::InternalError(absl::StrFormat("cudaSetDevice: %s", cudaGetErrorString(e)));
  }
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle.data(), sizeof(h));
  void* base = nullptr;
  if (cudaError_t e = cudaIpcOpenMemHandle(&base, h, cudaIpcMemLazyEnablePeerAccess); e != cudaSuccess) {
    cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrFormat("cudaIpcOpenMemHandle: %s", cudaGetErrorString(e)));
  }
  std::shared_ptr<const CudaIpcMapping> mapping(
      new CudaIpcMapping(static_cast<char*>(base), region_bytes, page_bytes, device, peer));
  opened[key] = mapping;
  return mapping;
}

CudaIpcMapping::~CudaIpcMapping() {
  cudaSetDevice(device_);
  if (cudaError_t e = cudaIpcCloseMemHandle(base_); e != cudaSuccess) {
    spdlog::warn("cudaIpcCloseMemHandle: {}", cudaGetErrorString(e));
  }
}

}  // namespace lazykv
