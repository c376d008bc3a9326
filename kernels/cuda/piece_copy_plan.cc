#include "kernels/cuda/piece_copy_plan.h"

namespace lazykv::cuda {

std::optional<std::vector<CopySegment>> PlanCopySegments(std::span<const std::string_view> pieces, uint64_t contiguous,
                                                         bool to_contiguous, uint64_t segment_bytes) {
  // A segment's size is 32 bits (CopySegment::bytes).
  if (contiguous % 16 != 0 || segment_bytes == 0 || segment_bytes % 16 != 0 || segment_bytes > (1ull << 31)) {
    return std::nullopt;
  }
  std::vector<CopySegment> segments;
  uint64_t offset = 0;
  size_t last = pieces.size();
  while (last > 0 && pieces[last - 1].empty()) --last;  // the last piece that holds bytes
  for (size_t i = 0; i < last; ++i) {
    const uint64_t address = reinterpret_cast<uint64_t>(pieces[i].data());
    const uint64_t size = pieces[i].size();
    if (size == 0) continue;
    if (address % 16 != 0 || (i + 1 < last && size % 16 != 0)) return std::nullopt;
    for (uint64_t at = 0; at < size; at += segment_bytes) {
      const uint64_t n = size - at < segment_bytes ? size - at : segment_bytes;
      const uint64_t piece_side = address + at, range_side = contiguous + offset + at;
      segments.push_back(CopySegment{.src = to_contiguous ? piece_side : range_side,
                                     .dst = to_contiguous ? range_side : piece_side,
                                     .offset = offset + at,
                                     .bytes = static_cast<uint32_t>(n),
                                     .unused = 0});
    }
    offset += size;
  }
  return segments;
}

}  // namespace lazykv::cuda
