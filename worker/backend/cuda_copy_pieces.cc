#include "worker/backend/cuda_copy_pieces.h"

#include <array>

#include "absl/strings/str_cat.h"
#include "common/device_mapped_regions.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/finite_check.h"
#include "kernels/cuda/piece_copy_plan.h"
#include "worker/backend/cuda_backend_internal.h"  // Cuda()

namespace lazykv::cuda_backend {
namespace {

// Where the device reads a piece in place, and whether it is device memory: pinned host
// memory mapped into the device's space, or memory of the current device (a CUDA IPC
// mapping of a cache server's GPU tier, a cudaMalloc). Nothing for pageable or managed
// memory, another device's, or a piece running past its pinned allocation. Both ends are
// asked (a piece is read whole by the kernel); a piece must lie in one allocation (the
// tier's pages of one segment do), which the runtime cannot tell apart from two allocations
// whose ends are mapped.
struct DeviceReadable {
  const char* address;
  bool device;
};
std::optional<DeviceReadable> DeviceReadableAddress(std::string_view piece, int current_device) {
  auto ask = [current_device](const void* p) -> std::optional<DeviceReadable> {
    cudaPointerAttributes attributes{};
    if (cudaPointerGetAttributes(&attributes, p) != cudaSuccess) {
      cudaGetLastError();
      return std::nullopt;
    }
    const char* address = static_cast<const char*>(attributes.devicePointer);
    if (attributes.type == cudaMemoryTypeHost && address != nullptr) return DeviceReadable{address, false};
    if (attributes.type == cudaMemoryTypeDevice && attributes.device == current_device && address == p) {
      return DeviceReadable{address, true};
    }
    return std::nullopt;
  };
  const std::optional<DeviceReadable> first = ask(piece.data());
  if (!first) return std::nullopt;
  const std::optional<DeviceReadable> last = ask(piece.data() + piece.size() - 1);
  if (!last || last->device != first->device || last->address != first->address + piece.size() - 1) {
    return std::nullopt;
  }
  return first;
}

// Whether the kernel beats the copy engines for these pinned host pieces: a DMA copy costs about 0.9 us
// of setup per contiguous run on top of its bytes, and the kernel moves bytes at about 92%
// of the copy engines' rate (`piece_copy_bench`, H100), which puts the break-even near
// 0.5-1 MiB a run. Measured: a 64 MiB chunk in scattered 256 KiB pages goes at 89-92%
// against 83-91% batched; a chunk in a few long runs (a fresh arena's) at 100% as one DMA
// copy against the kernel's 91%. The bound, 1 MiB, sits between the two. Runs of adjacent
// pieces count as one, as CopyPieces merges them.
bool FragmentedEnoughForTheKernel(const std::vector<std::string_view>& pieces) {
  constexpr uint64_t kMaxAverageRun = 1ull << 20;
  uint64_t bytes = 0, runs = 0;
  const char* end = nullptr;
  for (std::string_view piece : pieces) {
    if (piece.empty()) continue;
    if (piece.data() != end) ++runs;
    end = piece.data() + piece.size();
    bytes += piece.size();
  }
  return runs > 1 && bytes / runs < kMaxAverageRun;
}

}  // namespace

absl::Status CopyPieces(std::vector<void*> dsts, std::vector<const void*> srcs, std::vector<size_t> sizes,
                        cudaStream_t stream, const char* what) {
  size_t n = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == 0) continue;
    if (n > 0 && static_cast<char*>(dsts[n - 1]) + sizes[n - 1] == dsts[i] &&
        static_cast<const char*>(srcs[n - 1]) + sizes[n - 1] == srcs[i]) {
      sizes[n - 1] += sizes[i];
      continue;
    }
    dsts[n] = dsts[i];
    srcs[n] = srcs[i];
    sizes[n] = sizes[i];
    ++n;
  }
  if (n == 0) return absl::OkStatus();
  if (n > 1) {
    cudaMemcpyAttributes attributes{};
    attributes.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attributes.flags = cudaMemcpyFlagPreferOverlapWithCompute;
    size_t attribute_index = 0;
    if (cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), n, &attributes, &attribute_index, 1, stream) ==
        cudaSuccess) {
      return absl::OkStatus();
    }
    cudaGetLastError();  // not supported here: one by one
  }
  for (size_t i = 0; i < n; ++i) {
    RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(dsts[i], srcs[i], sizes[i], cudaMemcpyDefault, stream), what));
  }
  return absl::OkStatus();
}

absl::Status CopyPiecesContiguous(const std::vector<std::string_view>& pieces, void* contiguous, bool to_contiguous,
                                  cudaStream_t stream, const char* what) {
  std::vector<void*> dsts;
  std::vector<const void*> srcs;
  std::vector<size_t> sizes;
  char* range = static_cast<char*>(contiguous);
  for (std::string_view piece : pieces) {
    char* host = const_cast<char*>(piece.data());
    dsts.push_back(to_contiguous ? static_cast<void*>(range) : host);
    srcs.push_back(to_contiguous ? static_cast<const void*>(host) : range);
    sizes.push_back(piece.size());
    range += piece.size();
  }
  return CopyPieces(std::move(dsts), std::move(srcs), std::move(sizes), stream, what);
}

std::optional<KernelCopyPlan> PlanKernelCopy(const std::vector<std::string_view>& pieces, void* contiguous,
                                             bool to_contiguous) {
  std::vector<std::string_view> translated;
  translated.reserve(pieces.size());
  std::optional<DeviceMappedRegion> region;  // the last registered region a piece was in
  bool host = false, device = false;         // the kinds of memory met
  int current_device = -1;                   // asked at the first piece that needs it
  for (std::string_view piece : pieces) {
    if (piece.empty()) continue;
    if (!region || !region->Contains(piece.data(), piece.size())) {
      region = FindDeviceMappedRegion(piece.data(), piece.size());
    }
    if (region) {  // the cache tier's pages: no driver query
      if (!to_contiguous && !region->writable) return std::nullopt;
      translated.emplace_back(region->DeviceAddress(piece.data()), piece.size());
      host = true;
      continue;
    }
    // The driver does not say whether pinned memory was registered read-only, and a
    // kernel's write there is a fault that ends the process's CUDA context: the kernel
    // writes only into registered regions that say they are writable.
    if (!to_contiguous) return std::nullopt;
    if (current_device < 0 && cudaGetDevice(&current_device) != cudaSuccess) {
      cudaGetLastError();
      return std::nullopt;
    }
    const std::optional<DeviceReadable> readable = DeviceReadableAddress(piece, current_device);
    if (!readable) return std::nullopt;
    (readable->device ? device : host) = true;
    translated.emplace_back(readable->address, piece.size());
  }
  if (host && device) return std::nullopt;  // a mix
  // Pinned host pieces: only where fragmented (else one DMA copy is faster).
  if (host && !FragmentedEnoughForTheKernel(pieces)) return std::nullopt;
  // Device pieces in a few runs: a segment per SM (plus one per piece boundary), few enough to travel in
  // the launch itself (LaunchPieceCopyInline) where a 64 KiB segment's table would be
  // uploaded first; pinned host pieces keep the default (loads from the host wait a PCIe
  // round trip, which the kernel's many segments keep in flight).
  uint64_t segment_bytes = cuda::kCopySegmentBytes;
  // A chunk in many pieces keeps the small segments: with a segment per SM cut at every
  // piece's end, some CTAs would copy two large segments and the rest wait for them.
  if (device && translated.size() <= 4) {
    uint64_t total = 0;
    for (std::string_view piece : translated) total += piece.size();
    const uint64_t per_sm = (total + cuda::MultiprocessorCount() - 1) / cuda::MultiprocessorCount();
    segment_bytes = std::max<uint64_t>(cuda::kCopySegmentBytes, (per_sm + 15) / 16 * 16);
  }
  std::optional<std::vector<cuda::CopySegment>> segments =
      cuda::PlanCopySegments(translated, reinterpret_cast<uint64_t>(contiguous), to_contiguous, segment_bytes);
  if (!segments) return std::nullopt;
  if (device) {
    // Device to device, in any runs: one pass over every SM reads and writes the bytes once
    // with the check fused, where the copy engines copy them and a second kernel reads them
    // again. 64 MiB on the H100 (`piece_copy_bench`): 76% of one cudaMemcpy at a CTA of 512
    // threads per SM (71-73% at 2 or 4), against 62% for the copy then the check.
    return KernelCopyPlan{.segments = *std::move(segments),
                          .launch = {.max_ctas = cuda::MultiprocessorCount(), .threads = 512}};
  }
  // 32 CTAs of 1024 threads: 88-92% of a pinned cudaMemcpy on the H100, as many as 132 CTAs
  // gain about 1%, and the forward pass beside the copy keeps the other SMs.
  return KernelCopyPlan{.segments = *std::move(segments), .launch = {.max_ctas = 32, .threads = 1024}};
}

size_t KernelCopySegmentsBound(const std::vector<std::string_view>& pieces) {
  size_t bound = 0;
  for (std::string_view piece : pieces) bound += (piece.size() + cuda::kCopySegmentBytes - 1) / cuda::kCopySegmentBytes;
  return bound;
}

absl::Status EnqueueKernelCopy(const KernelCopyPlan& plan, cuda::CopySegment* table, cuda::Element element,
                               unsigned long long* first_bad, cudaStream_t stream) {
  const int segments = static_cast<int>(plan.segments.size());
  if (segments <= cuda::kInlineCopySegments) {
    return Cuda(cuda::LaunchPieceCopyInline(plan.segments.data(), segments, element, first_bad, stream, plan.launch),
                "piece copy");
  }
  RETURN_IF_ERROR(
      UploadDuringCall(table, plan.segments.data(), plan.segments.size() * sizeof(cuda::CopySegment), stream));
  return Cuda(
      cuda::LaunchPieceCopy(table, static_cast<int>(plan.segments.size()), element, first_bad, stream, plan.launch),
      "piece copy");
}

namespace {

// The kernel's plan for a gather, when it can take it (checked: whole elements only).
std::optional<KernelCopyPlan> GatherPlan(const std::vector<std::string_view>& pieces, void* device, uint64_t bytes,
                                         cuda::Element element, bool checked) {
  if (checked && bytes % cuda::ElementBytes(element) != 0) return std::nullopt;
  return PlanKernelCopy(pieces, device, /*to_contiguous=*/true);
}

// EnqueueGather with its plan made already.
absl::Status EnqueuePlannedGather(const std::optional<KernelCopyPlan>& plan,
                                  const std::vector<std::string_view>& pieces, void* device, uint64_t bytes,
                                  cuda::Element element, unsigned long long* first_bad, cuda::CopySegment* table,
                                  size_t table_room, cudaStream_t stream, const char* what) {
  if (plan && plan->segments.size() <= table_room) return EnqueueKernelCopy(*plan, table, element, first_bad, stream);
  RETURN_IF_ERROR(CopyPiecesContiguous(pieces, device, /*to_contiguous=*/true, stream, what));
  if (first_bad == nullptr) return absl::OkStatus();
  return Cuda(cuda::LaunchFindNonFinite(device, bytes, element, first_bad, stream), "value check");
}

// This thread's pinned word, mapped for every device (portable), for the thread's life:
// where check answers come back to the host.
absl::StatusOr<unsigned long long*> ThisThreadsPinnedWord() {
  struct PinnedWord {
    unsigned long long* word = nullptr;
    ~PinnedWord() {
      if (word != nullptr) cudaFreeHost(word);  // at process exit: cudaErrorCudartUnloading, harmlessly
    }
  };
  thread_local PinnedWord pinned;
  if (pinned.word == nullptr) {
    RETURN_IF_ERROR(Cuda(cudaHostAlloc(&pinned.word, sizeof(*pinned.word), cudaHostAllocPortable | cudaHostAllocMapped),
                         "check answer's pinned word"));
  }
  return pinned.word;
}

// This thread's published answer on one device (cuda::PublishedAnswer): its device words,
// made on first use and kept for the thread's life, and the thread's pinned word as the
// device sees it.
struct ThreadAnswer {
  int device = -1;
  void* device_words = nullptr;  // first_bad (UINT64_MAX), then ctas_done (0)
  cuda::PublishedAnswer answer;
  ~ThreadAnswer() { Free(); }
  // Gives back the device words (at the thread's exit, or after a failure).
  void Free() {
    int current = -1;
    if (device_words != nullptr && cudaGetDevice(&current) == cudaSuccess) {
      cudaSetDevice(device);
      cudaFree(device_words);
      cudaSetDevice(current);
    }
    device_words = nullptr;
    answer = {};
  }
};

// A value no launch publishes: an offset is below the chunk's size, UINT64_MAX means none.
constexpr unsigned long long kNotPublished = ~1ull;

// This thread's answer on the current device, made on first use with its words set on
// `stream` (ordered before the first launch on it, which the caller then waits for).
absl::StatusOr<ThreadAnswer*> ThisThreadsAnswer(cudaStream_t stream) {
  constexpr int kMaxDevices = 64;
  thread_local std::array<ThreadAnswer, kMaxDevices> answers;
  int device = 0;
  RETURN_IF_ERROR(Cuda(cudaGetDevice(&device), "current device"));
  if (device < 0 || device >= kMaxDevices) return absl::OutOfRangeError("device index past 64");
  ThreadAnswer& a = answers[device];
  if (a.answer.published != nullptr) return &a;
  ASSIGN_OR_RETURN(unsigned long long* word, ThisThreadsPinnedWord());
  a.device = device;
  absl::Status made = [&]() -> absl::Status {
    RETURN_IF_ERROR(Cuda(cudaMalloc(&a.device_words, 16), "check answer"));
    RETURN_IF_ERROR(Cuda(cudaMemsetAsync(a.device_words, 0xFF, 8, stream), "check answer"));
    RETURN_IF_ERROR(Cuda(cudaMemsetAsync(static_cast<char*>(a.device_words) + 8, 0, 4, stream), "check answer"));
    unsigned long long* mapped = nullptr;
    RETURN_IF_ERROR(Cuda(cudaHostGetDevicePointer(&mapped, word, 0), "check answer's pinned word"));
    a.answer =
        cuda::PublishedAnswer{.first_bad = static_cast<unsigned long long*>(a.device_words),
                              .ctas_done = reinterpret_cast<unsigned int*>(static_cast<char*>(a.device_words) + 8),
                              .published = mapped};
    return absl::OkStatus();
  }();
  if (!made.ok()) {
    cudaStreamSynchronize(stream);  // the memsets, if enqueued, before the words go
    a.Free();
    return made;
  }
  return &a;
}

}  // namespace

absl::Status EnqueueGather(const std::vector<std::string_view>& pieces, void* device, uint64_t bytes,
                           cuda::Element element, unsigned long long* first_bad, cuda::CopySegment* table,
                           size_t table_room, cudaStream_t stream, const char* what) {
  return EnqueuePlannedGather(GatherPlan(pieces, device, bytes, element, /*checked=*/first_bad != nullptr), pieces,
                              device, bytes, element, first_bad, table, table_room, stream, what);
}

absl::StatusOr<unsigned long long> GatherCheckedAndWait(const std::vector<std::string_view>& pieces, void* device,
                                                        uint64_t bytes, cuda::Element element,
                                                        unsigned long long* first_bad, cuda::CopySegment* table,
                                                        size_t table_room, cudaStream_t stream, const char* what) {
  const std::optional<KernelCopyPlan> plan = GatherPlan(pieces, device, bytes, element, /*checked=*/true);
  if (!plan || plan->segments.empty() || plan->segments.size() > static_cast<size_t>(cuda::kInlineCopySegments)) {
    RETURN_IF_ERROR(
        EnqueuePlannedGather(plan, pieces, device, bytes, element, first_bad, table, table_room, stream, what));
    return SynchronizeAndReadAnswer(first_bad, stream);
  }
  ASSIGN_OR_RETURN(ThreadAnswer * answer, ThisThreadsAnswer(stream));
  ASSIGN_OR_RETURN(unsigned long long* word, ThisThreadsPinnedWord());
  *reinterpret_cast<volatile unsigned long long*>(word) = kNotPublished;
  RETURN_IF_ERROR(
      Cuda(cuda::LaunchPieceCopyInlinePublished(plan->segments.data(), static_cast<int>(plan->segments.size()), element,
                                                answer->answer, stream, plan->launch),
           what));
  RETURN_IF_ERROR(Cuda(cudaStreamSynchronize(stream), what));
  // The grid's last CTA wrote it before the kernel ended.
  const unsigned long long published = *reinterpret_cast<volatile unsigned long long*>(word);
  if (published == kNotPublished) {  // the words were out of step: made again next time
    answer->Free();
    return absl::InternalError(absl::StrCat(what, ": the value check published no answer"));
  }
  return published;
}

absl::StatusOr<unsigned long long> SynchronizeAndReadAnswer(const unsigned long long* first_bad, cudaStream_t stream) {
  ASSIGN_OR_RETURN(unsigned long long* word, ThisThreadsPinnedWord());
  RETURN_IF_ERROR(
      Cuda(cudaMemcpyAsync(word, first_bad, sizeof(*first_bad), cudaMemcpyDeviceToHost, stream), "check answer"));
  RETURN_IF_ERROR(Cuda(cudaStreamSynchronize(stream), "check answer"));
  return *word;
}

absl::Status UploadDuringCall(void* device, const void* host, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return absl::OkStatus();
  cudaMemcpyAttributes attributes{};
  attributes.srcAccessOrder = cudaMemcpySrcAccessOrderDuringApiCall;
  size_t attribute_index = 0;
  if (cudaMemcpyBatchAsync(&device, &host, &bytes, 1, &attributes, &attribute_index, 1, stream) == cudaSuccess) {
    return absl::OkStatus();
  }
  cudaGetLastError();  // not supported here: a plain copy (it may wait for the stream's work)
  return Cuda(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, stream), "upload");
}

}  // namespace lazykv::cuda_backend
