#include "common/chunk_values.h"

#include <cstdint>
#include <cstring>

#include "absl/strings/str_format.h"

namespace lazykv {
namespace {

// The exponent bits of each element type: all ones is an infinity or a NaN.
template <typename Bits>
bool AllFinite(const char* data, size_t count, Bits exponent_mask, size_t* bad_index) {
  Bits any_bad = 0;
  for (size_t i = 0; i < count; ++i) {  // branch-free, so the loop vectorizes
    Bits v;
    std::memcpy(&v, data + i * sizeof(Bits), sizeof(Bits));
    any_bad |= static_cast<Bits>((v & exponent_mask) == exponent_mask);
  }
  if (!any_bad) return true;
  for (size_t i = 0; i < count; ++i) {
    Bits v;
    std::memcpy(&v, data + i * sizeof(Bits), sizeof(Bits));
    if ((v & exponent_mask) == exponent_mask) {
      *bad_index = i;
      return false;
    }
  }
  return false;
}

template <typename Bits>
absl::Status Check(std::span<const std::string_view> payload, Bits exponent_mask) {
  char carry[sizeof(Bits)];
  size_t carried = 0, offset = 0;  // offset: payload bytes before the current piece
  auto bad = [&](size_t byte) {
    return absl::DataLossError(absl::StrFormat("chunk payload holds a non-finite value at byte %d", byte));
  };
  for (std::string_view piece : payload) {
    size_t at = 0;
    if (carried > 0) {  // a value split across pieces
      const size_t take = std::min(sizeof(Bits) - carried, piece.size());
      std::memcpy(carry + carried, piece.data(), take);
      carried += take;
      at = take;
      if (carried < sizeof(Bits)) {  // the piece ended inside the value
        offset += piece.size();
        continue;
      }
      size_t index = 0;
      if (!AllFinite<Bits>(carry, 1, exponent_mask, &index)) return bad(offset + take - sizeof(Bits));
      carried = 0;
    }
    const size_t whole = (piece.size() - at) / sizeof(Bits);
    size_t index = 0;
    if (!AllFinite<Bits>(piece.data() + at, whole, exponent_mask, &index)) {
      return bad(offset + at + index * sizeof(Bits));
    }
    const size_t rest = piece.size() - at - whole * sizeof(Bits);
    std::memcpy(carry, piece.data() + piece.size() - rest, rest);
    carried = rest;
    offset += piece.size();
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckPayloadFinite(KvDtype dtype, std::span<const std::string_view> payload) {
  switch (dtype) {
    case KvDtype::kFp32:
      return Check<uint32_t>(payload, 0x7F800000u);
    case KvDtype::kBf16:
      return Check<uint16_t>(payload, static_cast<uint16_t>(0x7F80));
    case KvDtype::kFp16:
      return Check<uint16_t>(payload, static_cast<uint16_t>(0x7C00));
  }
  return absl::InvalidArgumentError("unknown KV dtype");
}

}  // namespace lazykv
