// A copy between scattered pieces and one contiguous device range by a kernel (the plan:
// piece_copy_plan.h), for chunks that rest in pinned host pages or in another process's
// device memory. Optionally checks the values on the way (the CUDA twin of
// common/chunk_values.h's CheckPayloadFinite, fused so the bytes are read once).
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda/copy_segment.h"
#include "kernels/cuda/element_type.h"

namespace lazykv::cuda {

struct PieceCopyLaunch {
  // CTAs in the grid, each taking segments in turn. A few dozen keep PCIe busy and leave
  // the other SMs to the forward pass running beside the copy.
  int max_ctas = 32;
  int threads = 512;
};

// Runs `num_segments` segments (device memory, as PlanCopySegments made them) on `stream`.
// With `first_bad` (device) non-null, also sets *first_bad to the offset of the first
// element of `element` values that is an infinity or a NaN (UINT64_MAX when none); the
// offsets are the segments' `offset`s. Every address in the segments must be one the
// device can read or write (device memory, or pinned host memory mapped under unified
// addressing). REQUIRES: the segments' rules of PlanCopySegments; with `first_bad`, the
// last segment's size a whole number of elements.
cudaError_t LaunchPieceCopy(const CopySegment* segments, int num_segments, Element element,
                            unsigned long long* first_bad, cudaStream_t stream, PieceCopyLaunch launch = {});

// At most this many segments travel inside the launch's own parameters (5 KiB; Volta and
// later take up to 32 KiB since CUDA 12.1).
inline constexpr int kInlineCopySegments = 160;

// LaunchPieceCopy with the segments read from host memory here (`host_segments`, at most
// kInlineCopySegments) and passed in the launch itself: no table is uploaded first, which
// for a 64 MiB device-to-device copy (55 us) is a tenth of its time. Same contract
// otherwise; cudaErrorInvalidValue past kInlineCopySegments.
cudaError_t LaunchPieceCopyInline(const CopySegment* host_segments, int num_segments, Element element,
                                  unsigned long long* first_bad, cudaStream_t stream, PieceCopyLaunch launch = {});

// A value check's answer that the kernel resets and publishes itself, so that no memset
// before it and no copy after it are enqueued (each a few microseconds of a 70 us fetch):
// `first_bad` and `ctas_done` (device) hold UINT64_MAX and 0 between launches (set so once
// at allocation; every launch leaves them so), and the grid's last CTA writes the answer to
// `published` (pinned host memory mapped for the device), readable once the stream is done.
struct PublishedAnswer {
  unsigned long long* first_bad = nullptr;
  unsigned int* ctas_done = nullptr;
  unsigned long long* published = nullptr;  // the device's address of the pinned word
};

// LaunchPieceCopyInline checking `element` values into `answer` (its contract above). Not
// two at once on one answer. At least one segment.
cudaError_t LaunchPieceCopyInlinePublished(const CopySegment* host_segments, int num_segments, Element element,
                                           const PublishedAnswer& answer, cudaStream_t stream,
                                           PieceCopyLaunch launch = {});

}  // namespace lazykv::cuda
