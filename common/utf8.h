// UTF-8 for streamed text: a protobuf string must be valid UTF-8, while a model's
// tokens may end inside a character (byte-fallback tokens) or be no text at all
// (random models).
#pragma once

#include <string>
#include <string_view>

namespace lazykv {

// The length of the longest prefix of `text` that does not end inside a character
// which more bytes could still complete.
size_t CompleteUtf8Prefix(std::string_view text);

// `text` with every ill-formed sequence replaced by one U+FFFD: a byte that starts no
// character is one, and so is the longest start of a character that stops short (the
// "maximal subpart" rule of Unicode section 3.9, which WHATWG and Hugging Face follow).
std::string SanitizeUtf8(std::string_view text);

}  // namespace lazykv
