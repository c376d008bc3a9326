// A chunk payload's values checked on the device after staging (the CUDA twin of
// common/chunk_values.h's CheckPayloadFinite): one pass at memory speed instead of a CPU
// pass over tens of MiB on the fetch path (DESIGN.md section 5).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/element_type.h"

namespace lazykv::cuda {

// Sets *first_bad (device) to the byte offset of the first element of `bytes` bytes of
// `element` values at `data` (device) that is an infinity or a NaN, or to UINT64_MAX when
// all are finite. REQUIRES: `bytes` a multiple of the element's size; `data` aligned to
// the element (16-byte alignment takes the vector path). Enqueued on `stream`.
cudaError_t LaunchFindNonFinite(const void* data, uint64_t bytes, Element element, unsigned long long* first_bad,
                                cudaStream_t stream);

}  // namespace lazykv::cuda
