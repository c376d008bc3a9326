// Where a value laid out over fixed-size pages of one region rests, as contiguous runs: the
// arithmetic shared by the cache server's arenas and a worker's mappings of them (host
// arena over shared memory, GPU tier over CUDA IPC or a peer link).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace lazykv {

// [offset, offset + length) of a value laid out over `pages` of `page_bytes` in a region
// of `region_bytes` at `base`, as contiguous runs (adjacent pages merged). INVALID_ARGUMENT
// when a page lies outside the region or the range outside the pages (no product or sum
// wraps: the pages may come from another process). Pure arithmetic: `base` is never read.
absl::StatusOr<std::vector<std::string_view>> PagedPieces(const char* base, uint64_t region_bytes, uint64_t page_bytes,
                                                          std::span<const uint32_t> pages, uint64_t offset,
                                                          uint64_t length);

}  // namespace lazykv
