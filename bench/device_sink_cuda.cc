#include <cuda_runtime.h>

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "bench/device_sink.h"
#include "kernels/cuda/piece_copy_plan.h"
#include "worker/backend/cuda_copy_pieces.h"

namespace lazykv::bench {
namespace {

absl::Status Check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrFormat("%s: %s", what, cudaGetErrorString(e)));
}

class CudaSink final : public DeviceSink {
 public:
  explicit CudaSink(bool copy_engines) : copy_engines_(copy_engines) {}
  ~CudaSink() override {
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    cudaFree(device_);
    cudaFree(first_bad_);
    cudaFreeHost(pinned_);
    cudaFree(source_);
    cudaFree(table_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  absl::Status Init(size_t bytes) {
    bytes_ = bytes;
    if (absl::Status s = Check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "stream"); !s.ok()) return s;
    if (absl::Status s = Check(cudaMalloc(&device_, bytes), "device buffer"); !s.ok()) return s;
    if (absl::Status s = Check(cudaMalloc(&first_bad_, sizeof(*first_bad_)), "check answer"); !s.ok()) return s;
    if (absl::Status s = Check(cudaMallocHost(&pinned_, bytes), "pinned buffer"); !s.ok()) return s;
    // The piece copy kernel's table, made here rather than in a timed copy: room for a chunk
    // of `bytes` in up to 4096 pieces (more grows it).
    if (absl::Status s = GrowTable(bytes / cuda::kCopySegmentBytes + 4096); !s.ok()) return s;
    std::memset(pinned_, 0, bytes);
    cudaDeviceProp prop{};
    int device = 0;
    cudaGetDevice(&device);
    cudaGetDeviceProperties(&prop, device);
    name_ = prop.name;
    return absl::OkStatus();
  }

  absl::Status Consume(std::span<const std::string_view> pieces) override {
    // As the backend's StageChunk copies (EnqueueGather): the piece copy kernel with the
    // value check where it takes the pieces, else one batched call and the check after.
    size_t offset = 0;
    for (std::string_view piece : pieces) offset += piece.size();
    if (offset > bytes_) return absl::InvalidArgumentError("chunk larger than the sink");
    const std::vector<std::string_view> list(pieces.begin(), pieces.end());
    if (!copy_engines_) {
      if (absl::Status s = GrowTable(cuda_backend::KernelCopySegmentsBound(list)); !s.ok()) return s;
    }
    // As the backend's staging gathers, checks and waits; or by the copy engines (no table room).
    absl::StatusOr<unsigned long long> first_bad;
    if (copy_engines_) {
      if (absl::Status s = cuda_backend::EnqueueGather(list, device_, offset, cuda::Element::kBf16, first_bad_, table_,
                                                       0, stream_, "copy");
          !s.ok()) {
        return s;
      }
      first_bad = cuda_backend::SynchronizeAndReadAnswer(first_bad_, stream_);
    } else {
      first_bad = cuda_backend::GatherCheckedAndWait(list, device_, offset, cuda::Element::kBf16, first_bad_, table_,
                                                     table_segments_, stream_, "copy");
    }
    if (!first_bad.ok()) return first_bad.status();
    if (*first_bad != ~0ull) return absl::DataLossError(absl::StrFormat("non-finite value at byte %d", *first_bad));
    return absl::OkStatus();
  }

  absl::Status CopyFromPinned(size_t bytes) override {
    if (bytes > bytes_) return absl::InvalidArgumentError("larger than the sink");
    if (absl::Status s = Check(cudaMemcpyAsync(device_, pinned_, bytes, cudaMemcpyHostToDevice, stream_), "copy");
        !s.ok()) {
      return s;
    }
    return Check(cudaStreamSynchronize(stream_), "synchronize");
  }

  absl::Status CopyFromDevice(size_t bytes) override {
    if (bytes > bytes_) return absl::InvalidArgumentError("larger than the sink");
    if (source_ == nullptr) {
      if (absl::Status s = Check(cudaMalloc(&source_, bytes_), "device source"); !s.ok()) return s;
      if (absl::Status s = Check(cudaMemset(source_, 0, bytes_), "device source"); !s.ok()) return s;
    }
    if (absl::Status s = Check(cudaMemcpyAsync(device_, source_, bytes, cudaMemcpyDeviceToDevice, stream_), "copy");
        !s.ok()) {
      return s;
    }
    return Check(cudaStreamSynchronize(stream_), "synchronize");
  }
  absl::Status ReadBack(size_t bytes, char* out) override {
    if (bytes > bytes_) return absl::InvalidArgumentError("larger than the sink");
    return Check(cudaMemcpy(out, device_, bytes, cudaMemcpyDeviceToHost), "read back");
  }
  std::string Describe() const override { return name_; }

 private:
  // Room for `segments` in the kernel's segment table (the stream is idle between chunks).
  absl::Status GrowTable(size_t segments) {
    if (segments <= table_segments_) return absl::OkStatus();
    cudaFree(table_);
    table_ = nullptr;
    table_segments_ = 0;
    if (absl::Status s = Check(cudaMalloc(&table_, segments * sizeof(cuda::CopySegment)), "segment table"); !s.ok()) {
      return s;
    }
    table_segments_ = segments;
    return absl::OkStatus();
  }

  const bool copy_engines_;
  size_t bytes_ = 0;
  cudaStream_t stream_ = nullptr;
  void* device_ = nullptr;
  unsigned long long* first_bad_ = nullptr;
  void* pinned_ = nullptr;
  void* source_ = nullptr;  // CopyFromDevice's, made at its first call
  cuda::CopySegment* table_ = nullptr;
  size_t table_segments_ = 0;
  std::string name_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceSink>> DeviceSink::Create(size_t bytes, bool copy_engines) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    return absl::UnavailableError("--device: no CUDA device");
  }
  auto sink = std::make_unique<CudaSink>(copy_engines);
  if (absl::Status s = sink->Init(bytes); !s.ok()) return s;
  return std::unique_ptr<DeviceSink>(std::move(sink));
}

}  // namespace lazykv::bench
