// A piece copy's unit of work, shared by the host planner (piece_copy_plan.h, C++20) and
// the kernel (piece_copy.h, compiled as C++17 by nvcc).
#pragma once

#include <cstdint>

namespace lazykv::cuda {

// One CTA's share: `bytes` from `src` to `dst`, which is byte `offset` of the contiguous
// side. 32 bytes, as the kernel reads it.
struct CopySegment {
  uint64_t src = 0;
  uint64_t dst = 0;
  uint64_t offset = 0;
  uint32_t bytes = 0;
  uint32_t unused = 0;
};
static_assert(sizeof(CopySegment) == 32);

}  // namespace lazykv::cuda
