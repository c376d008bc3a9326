// Host or device pieces to or from one device range (the chunk transfer's copies, and the
// same-host fetch benchmarks'): by the piece copy kernel where pinned host pieces are
// scattered or device pieces are gathered, else by the copy engines in as few CUDA calls as
// it takes.
#pragma once

#include <cuda_runtime.h>

#include <optional>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/copy_segment.h"
#include "kernels/cuda/element_type.h"
#include "kernels/cuda/piece_copy.h"

namespace lazykv::cuda_backend {

// Copies between host pieces and one device range on `stream`, as few API calls as it
// takes: adjacent pieces are merged, and the rest go in one cudaMemcpyBatchAsync. Falls
// back to one cudaMemcpyAsync per piece where batching is refused. Thread-safe (enqueues
// on `stream` only).
absl::Status CopyPieces(std::vector<void*> dsts, std::vector<const void*> srcs, std::vector<size_t> sizes,
                        cudaStream_t stream, const char* what);

// CopyPieces between `pieces` (in order) and the device range at `contiguous`: gathered
// into it when `to_contiguous`, else scattered from it. Thread-safe.
absl::Status CopyPiecesContiguous(const std::vector<std::string_view>& pieces, void* contiguous, bool to_contiguous,
                                  cudaStream_t stream, const char* what);

// The piece copy kernel's segments and launch for one copy.
struct KernelCopyPlan {
  std::vector<cuda::CopySegment> segments;
  cuda::PieceCopyLaunch launch;
};

// The piece copy kernel's plan between `pieces` and the device range at `contiguous`
// (gather into it when `to_contiguous`), with every piece translated to the address the
// device reads it at, when the kernel is the faster way: every piece is pinned host memory
// mapped into the device's space and the pieces are fragmented (runs of adjacent pieces
// averaging under 1 MiB; a few long runs go faster by the copy engines); or every piece is
// memory of the current device (a CUDA IPC mapping of a cache server's GPU tier) to gather,
// in any runs, over every SM. Nothing otherwise (pageable memory, a mix, device memory to
// scatter into, pieces breaking the alignment rules of piece_copy_plan.h): the caller then
// uses CopyPieces. A copy out of the contiguous range
// (`to_contiguous` false) writes only into regions registered in
// common/device_mapped_regions.h as writable (the cache tier's pinned arenas): the driver
// cannot tell read-only pinned memory apart. Pieces in a registered region cost a lookup per
// region; others two driver queries per piece (about 0.2 us each). Thread-safe.
std::optional<KernelCopyPlan> PlanKernelCopy(const std::vector<std::string_view>& pieces, void* contiguous,
                                             bool to_contiguous);

// At most how many segments PlanKernelCopy makes for these pieces (room for its table).
size_t KernelCopySegmentsBound(const std::vector<std::string_view>& pieces);

// Uploads `plan`'s segments into `table` (device, room for them all; the plan may go as
// soon as this returns) and runs it on `stream`, checking `element` values into
// `first_bad` when non-null (LaunchPieceCopy's contract). Thread-safe.
absl::Status EnqueueKernelCopy(const KernelCopyPlan& plan, cuda::CopySegment* table, cuda::Element element,
                               unsigned long long* first_bad, cudaStream_t stream);

// `pieces` (`bytes` in all) gathered into the device range at `device` on `stream`, and with
// `first_bad` (device) non-null their `element` values checked into it (LaunchPieceCopy's
// answer): by the piece copy kernel with the check fused where PlanKernelCopy takes the
// pieces and `table` (device) has room for its segments (`table_room`), else by the copy
// engines and then LaunchFindNonFinite. Thread-safe (enqueues on `stream` only).
absl::Status EnqueueGather(const std::vector<std::string_view>& pieces, void* device, uint64_t bytes,
                           cuda::Element element, unsigned long long* first_bad, cuda::CopySegment* table,
                           size_t table_room, cudaStream_t stream, const char* what);

// `pieces` (`bytes` in all) gathered into the device range at `device` on `stream`, their
// `element` values checked, and `stream` waited for: the offset of the first non-finite value
// (UINT64_MAX when none). Where the kernel's plan travels in its launch, the kernel publishes
// its own answer into this thread's pinned word (cuda::PublishedAnswer: no memset before it,
// no copy after it); else as EnqueueGather with `first_bad` (device, the caller's), then
// SynchronizeAndReadAnswer. Thread-safe (the published answer's words are the calling thread's,
// per device).
absl::StatusOr<unsigned long long> GatherCheckedAndWait(const std::vector<std::string_view>& pieces, void* device,
                                                        uint64_t bytes, cuda::Element element,
                                                        unsigned long long* first_bad, cuda::CopySegment* table,
                                                        size_t table_room, cudaStream_t stream, const char* what);

// Waits for `stream` and returns the value check's answer at `first_bad` (device), read back
// through this thread's pinned word: a copy into pageable memory is staged by the driver and
// cost a 64 MiB device-to-device fetch several microseconds more (piece_copy_bench).
// Thread-safe (the word is the calling thread's; the call returns only once it is read).
absl::StatusOr<unsigned long long> SynchronizeAndReadAnswer(const unsigned long long* first_bad, cudaStream_t stream);

// A host-to-device copy of pageable `host` enqueued on `stream` that has read the host bytes
// by the time it returns: the source may be reused at once, and the call does not wait for
// the work queued on `stream` (which a plain cudaMemcpyAsync from pageable memory may do).
absl::Status UploadDuringCall(void* device, const void* host, size_t bytes, cudaStream_t stream);

}  // namespace lazykv::cuda_backend
