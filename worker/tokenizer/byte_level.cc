#include "worker/tokenizer/byte_level.h"

#include <array>

namespace lazykv::byte_level {
namespace {

bool StandsForItself(int b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255); }

struct Tables {
  std::array<char32_t, 256> char_of{};
  std::array<int16_t, 256 + 68> byte_of{};  // code point -> byte, -1 for none
  Tables() {
    byte_of.fill(-1);
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      char_of[b] = StandsForItself(b) ? static_cast<char32_t>(b) : static_cast<char32_t>(next++);
      byte_of[char_of[b]] = static_cast<int16_t>(b);
    }
  }
};

const Tables& GetTables() {
  static const Tables tables;
  return tables;
}

void AppendUtf8(char32_t c, std::string& out) {  // only U+0000..U+07FF occur here
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

}  // namespace

char32_t CharOf(uint8_t byte) { return GetTables().char_of[byte]; }

std::string Spell(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char b : bytes) AppendUtf8(CharOf(static_cast<uint8_t>(b)), out);
  return out;
}

std::optional<std::string> Unspell(std::string_view text) {
  const Tables& t = GetTables();
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const auto b0 = static_cast<uint8_t>(text[i]);
    char32_t c;
    if (b0 < 0x80) {
      c = b0;
      i += 1;
    } else if ((b0 & 0xE0) == 0xC0 && b0 >= 0xC2 && i + 1 < text.size() &&
               (static_cast<uint8_t>(text[i + 1]) & 0xC0) == 0x80) {
      c = static_cast<char32_t>((b0 & 0x1F) << 6 | (static_cast<uint8_t>(text[i + 1]) & 0x3F));
      i += 2;
    } else {
      return std::nullopt;  // longer sequences are all outside the alphabet (or not UTF-8)
    }
    if (c >= t.byte_of.size() || t.byte_of[c] < 0) return std::nullopt;
    out.push_back(static_cast<char>(t.byte_of[c]));
  }
  return out;
}

}  // namespace lazykv::byte_level
