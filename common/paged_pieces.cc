#include "common/paged_pieces.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace lazykv {

absl::StatusOr<std::vector<std::string_view>> PagedPieces(const char* base, uint64_t region_bytes, uint64_t page_bytes,
                                                          std::span<const uint32_t> pages, uint64_t offset,
                                                          uint64_t length) {
  // The server's answer is not trusted: no product or sum below may wrap.
  if (page_bytes == 0) return absl::InvalidArgumentError("page_bytes is 0");
  if (pages.size() > ~0ull / page_bytes || offset > pages.size() * page_bytes ||
      length > pages.size() * page_bytes - offset) {
    return absl::InvalidArgumentError(absl::StrFormat("bytes [%d, %d) are past the %d pages given", offset,
                                                      offset + length, pages.size()));
  }
  std::vector<std::string_view> out;
  while (length > 0) {
    const uint64_t index = offset / page_bytes, in_page = offset % page_bytes;
    const uint64_t page = pages[index];
    if (page >= region_bytes / page_bytes) {
      return absl::InvalidArgumentError(
          absl::StrFormat("page %d lies outside the region of %d bytes", page, region_bytes));
    }
    const uint64_t run = std::min(length, page_bytes - in_page);
    const char* at = base + page * page_bytes + in_page;
    if (!out.empty() && out.back().data() + out.back().size() == at) {
      out.back() = std::string_view(out.back().data(), out.back().size() + run);
    } else {
      out.emplace_back(at, run);
    }
    offset += run;
    length -= run;
  }
  return out;
}

}  // namespace lazykv
