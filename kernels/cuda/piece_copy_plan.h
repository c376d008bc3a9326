// The plan of a copy between scattered pieces and one contiguous range, cut into segments
// that a copy kernel's CTAs take one at a time (kernels/cuda/piece_copy.h). Plain C++: the
// CPU tests check the plan, the GPU runs it.
//
// Why a kernel and not the copy engines: a chunk in the cache tier's 256 KiB host pages is
// hundreds of pieces, and each DMA copy of one costs a fixed setup on top of its bytes
// (a batched cudaMemcpyBatchAsync of 257 pieces ran at 79-83% of one pinned memcpy of the
// same bytes on the H100). A kernel's loads and stores to mapped pinned memory cross PCIe
// as well as DMA does, with no cost per piece, and can check the values on the way.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "kernels/cuda/copy_segment.h"

namespace lazykv::cuda {

// The default segment: large enough that a CTA's loads stay in flight, small enough that
// a 64 MiB chunk spreads over every CTA of the grid.
inline constexpr uint64_t kCopySegmentBytes = 64 << 10;

// Segments copying `pieces` (each an address and a size, in order) to or from the range
// that starts at `contiguous`: gather (pieces -> range) when `to_contiguous`, else scatter
// (range -> pieces). Every segment is at most `segment_bytes` (a multiple of 16). Returns
// nothing when the kernel cannot take the copy: a piece's address, or any size but the
// last piece's, not a multiple of 16, or the contiguous range not 16-byte aligned. Empty
// pieces are skipped; `segment_bytes` is at most 2 GiB. The addresses are those the device sees (for mapped pinned
// memory under unified addressing, the host's).
std::optional<std::vector<CopySegment>> PlanCopySegments(std::span<const std::string_view> pieces, uint64_t contiguous,
                                                         bool to_contiguous,
                                                         uint64_t segment_bytes = kCopySegmentBytes);

}  // namespace lazykv::cuda
