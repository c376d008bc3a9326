// GPT-2's byte-level alphabet (`bytes_to_unicode`), which Hugging Face's ByteLevel
// pre-tokenizer and decoder use: each of the 256 bytes is one printable character, so a
// byte-level BPE vocabulary spells byte strings as text ("Ġthe" is " the"). The printable
// bytes 33..126, 161..172 and 174..255 stand for themselves; the other 68 are U+0100..U+0143
// in byte order.
//
// Stateless: every function may be called from any number of threads.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace lazykv::byte_level {

// The code point that stands for `byte`.
char32_t CharOf(uint8_t byte);

// `bytes` spelled in the alphabet, UTF-8 encoded.
std::string Spell(std::string_view bytes);

// The bytes a byte-level string stands for; nullopt if it is not valid UTF-8 or holds a
// character outside the alphabet.
std::optional<std::string> Unspell(std::string_view text);

}  // namespace lazykv::byte_level
