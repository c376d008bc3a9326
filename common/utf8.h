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

// `text` with every byte that is not part of a valid UTF-8 character replaced by
// U+FFFD.
std::string SanitizeUtf8(std::string_view text);

}  // namespace lazykv
