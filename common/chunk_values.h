// A chunk payload's values: whether every one is finite. A NaN or an infinity in KV
// spreads through attention to every token that reads it, so a fetched chunk holding one
// is refused before it reaches the GPU, whoever signed it.
#pragma once

#include <span>
#include <string_view>

#include "absl/status/status.h"
#include "common/chunk_codec.h"

namespace lazykv {

// DATA_LOSS naming the first non-finite value's byte offset; OK when all are finite.
// Pieces may split a value anywhere. Thread-safe (pure).
absl::Status CheckPayloadFinite(KvDtype dtype, std::span<const std::string_view> payload);

}  // namespace lazykv
