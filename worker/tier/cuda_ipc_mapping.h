// A same-host cache server's GPU tier as this worker sees it (DESIGN.md section 5): the
// tier's device memory, exported by the server as one CUDA IPC handle, opened once per
// session on the worker's GPU (the same GPU, or another with peer access: then the copies
// go over NVLink or PCIe peer to peer). A chunk there is a list of pages; its bytes are
// device pointers into the opened allocation, copied device to device into staging.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/paged_pieces.h"

namespace lazykv {

// Thread-safe (immutable once opened). Closes the handle when the last holder goes (the
// chunk bytes handed out hold it).
class CudaIpcMapping {
 public:
  // Opens `handle` (64 bytes) of memory on the GPU whose UUID is `device_uuid`, from the
  // worker's GPU `device`. FAILED_PRECONDITION when that GPU is not visible from here, or is
  // another GPU without peer access; or in a build without CUDA.
  static absl::StatusOr<std::shared_ptr<const CudaIpcMapping>> Open(std::string_view handle,
                                                                    std::string_view device_uuid, int device,
                                                                    uint64_t region_bytes, uint64_t page_bytes);
  ~CudaIpcMapping();
  CudaIpcMapping(const CudaIpcMapping&) = delete;
  CudaIpcMapping& operator=(const CudaIpcMapping&) = delete;

  uint64_t bytes() const { return bytes_; }
  uint64_t page_bytes() const { return page_bytes_; }
  bool peer() const { return peer_; }  // on another GPU than the worker's
  absl::StatusOr<std::vector<std::string_view>> Pieces(std::span<const uint32_t> pages, uint64_t offset,
                                                       uint64_t length) const {
    return PagedPieces(base_, bytes_, page_bytes_, pages, offset, length);
  }

 private:
  CudaIpcMapping(char* base, uint64_t bytes, uint64_t page_bytes, int device, bool peer)
      : base_(base), bytes_(bytes), page_bytes_(page_bytes), device_(device), peer_(peer) {}
  char* const base_;
  const uint64_t bytes_;
  const uint64_t page_bytes_;
  [[maybe_unused]] const int device_;  // read by the CUDA build only
  const bool peer_;
};

}  // namespace lazykv
