#include "common/utf8.h"

#include <algorithm>

namespace lazykv {
namespace {

// The length of the character `lead` starts (0: not a lead byte).
int SequenceLength(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;
}

// Whether text[i..] starts a valid character of `length` bytes (RFC 3629: no overlong
// forms, no surrogates, nothing past U+10FFFF); `available` bytes may be fewer, and then
// only the bytes present are checked.
bool ValidSoFar(std::string_view text, size_t i, int length, size_t available) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[i + k]); };
  for (size_t k = 1; k < static_cast<size_t>(length) && k < available; ++k) {
    unsigned char lo = 0x80, hi = 0xBF;
    if (k == 1) {
      if (byte(0) == 0xE0) lo = 0xA0;
      if (byte(0) == 0xED) hi = 0x9F;
      if (byte(0) == 0xF0) lo = 0x90;
      if (byte(0) == 0xF4) hi = 0x8F;
    }
    if (byte(k) < lo || byte(k) > hi) return false;
  }
  return true;
}

}  // namespace

size_t CompleteUtf8Prefix(std::string_view text) {
  // Only the last three bytes can belong to an unfinished character.
  for (size_t back = 1; back <= 3 && back <= text.size(); ++back) {
    const size_t i = text.size() - back;
    const int length = SequenceLength(static_cast<unsigned char>(text[i]));
    if (length == 0) continue;  // a continuation byte (or invalid): look further back
    if (static_cast<size_t>(length) > back && ValidSoFar(text, i, length, back)) return i;
    break;
  }
  return text.size();
}

std::string SanitizeUtf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const int length = SequenceLength(static_cast<unsigned char>(text[i]));
    // The bytes at i that are still a well-formed start of a character: all of it, or a
    // "maximal subpart" that becomes one U+FFFD (Unicode 3.9, as WHATWG and Hugging Face
    // decode), so a character cut short reads as one replacement, not one per byte.
    size_t valid = length > 0 ? 1 : 0;
    while (valid > 0 && valid < static_cast<size_t>(length) && i + valid < text.size() &&
           ValidSoFar(text, i, length, valid + 1)) {
      ++valid;
    }
    if (length > 0 && valid == static_cast<size_t>(length)) {
      out.append(text.substr(i, length));
      i += length;
    } else {
      out.append("\xEF\xBF\xBD");
      i += std::max<size_t>(valid, 1);
    }
  }
  return out;
}

}  // namespace lazykv
