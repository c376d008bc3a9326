#include "worker/chat_template/py_string.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace lazykv::jinja {

bool IsPySpace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

char32_t DecodeAt(std::string_view s, size_t pos, size_t* length) {
  const auto b0 = static_cast<uint8_t>(s[pos]);
  *length = 1;
  if (b0 < 0x80) return b0;
  size_t need = 0;
  char32_t c = 0;
  char32_t min = 0;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1, c = b0 & 0x1F, min = 0x80;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2, c = b0 & 0x0F, min = 0x800;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3, c = b0 & 0x07, min = 0x10000;
  } else {
    return 0xFFFD;
  }
  if (pos + need >= s.size()) return 0xFFFD;
  for (size_t i = 1; i <= need; ++i) {
    const auto b = static_cast<uint8_t>(s[pos + i]);
    if ((b & 0xC0) != 0x80) return 0xFFFD;
    c = (c << 6) | (b & 0x3F);
  }
  if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return 0xFFFD;
  *length = need + 1;
  return c;
}

void AppendUtf8(char32_t c, std::string* out) {
  if (c < 0x80) {
    out->push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (c >> 6)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (c >> 12)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (c >> 18)));
    out->push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

std::vector<size_t> CodePointOffsets(std::string_view s) {
  std::vector<size_t> offsets;
  for (size_t pos = 0, length = 0; pos < s.size(); pos += length) {
    offsets.push_back(pos);
    DecodeAt(s, pos, &length);
  }
  offsets.push_back(s.size());
  return offsets;
}

size_t CodePointCount(std::string_view s) {
  size_t count = 0;
  for (size_t pos = 0, length = 0; pos < s.size(); pos += length, ++count) DecodeAt(s, pos, &length);
  return count;
}

namespace {

std::vector<char32_t> Decode(std::string_view s) {
  std::vector<char32_t> out;
  for (size_t pos = 0, length = 0; pos < s.size(); pos += length) out.push_back(DecodeAt(s, pos, &length));
  return out;
}

bool InSet(char32_t c, const std::optional<std::vector<char32_t>>& set) {
  if (!set) return IsPySpace(c);
  for (char32_t x : *set) {
    if (x == c) return true;
  }
  return false;
}

// str.isprintable() for the characters templates meet: controls, format characters and
// separators other than the space are not (an approximation of Python's Unicode tables).
bool PyPrintable(char32_t c) {
  if (c < 0x20 || (c >= 0x7F && c <= 0xA0) || c == 0xAD) return false;
  if (c == 0x1680 || (c >= 0x2000 && c <= 0x200F) || (c >= 0x2028 && c <= 0x202F) || (c >= 0x205F && c <= 0x2064))
    return false;
  return c != 0x3000 && c != 0xFEFF;
}

}  // namespace

std::string PyStrip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right) {
  std::optional<std::vector<char32_t>> set;
  if (chars) set = Decode(*chars);
  const std::vector<size_t> offsets = CodePointOffsets(s);
  size_t begin = 0, end = offsets.size() - 1;  // code point indices
  size_t length = 0;
  if (left) {
    while (begin < end && InSet(DecodeAt(s, offsets[begin], &length), set)) ++begin;
  }
  if (right) {
    while (end > begin && InSet(DecodeAt(s, offsets[end - 1], &length), set)) --end;
  }
  return std::string(s.substr(offsets[begin], offsets[end] - offsets[begin]));
}

std::vector<std::string> PySplit(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit) {
  std::vector<std::string> parts;
  if (sep) {
    size_t start = 0;
    while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
      const size_t at = s.find(*sep, start);
      if (at == std::string_view::npos) break;
      parts.emplace_back(s.substr(start, at - start));
      start = at + sep->size();
    }
    parts.emplace_back(s.substr(start));
    return parts;
  }
  size_t pos = 0, length = 0;
  while (true) {
    while (pos < s.size() && IsPySpace(DecodeAt(s, pos, &length))) pos += length;
    if (pos >= s.size()) break;
    if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
      // The rest, with its trailing whitespace stripped.
      std::string rest = PyStrip(s.substr(pos), std::nullopt, false, true);
      parts.push_back(std::move(rest));
      break;
    }
    const size_t start = pos;
    while (pos < s.size() && !IsPySpace(DecodeAt(s, pos, &length))) pos += length;
    parts.emplace_back(s.substr(start, pos - start));
  }
  return parts;
}

std::string PyReplace(std::string_view s, std::string_view old_text, std::string_view new_text, int64_t count) {
  std::string out;
  int64_t done = 0;
  if (old_text.empty()) {
    const std::vector<size_t> offsets = CodePointOffsets(s);
    for (size_t i = 0; i + 1 < offsets.size(); ++i) {
      if (count < 0 || done < count) out.append(new_text), ++done;
      out.append(s.substr(offsets[i], offsets[i + 1] - offsets[i]));
    }
    if (count < 0 || done < count) out.append(new_text);
    return out;
  }
  size_t start = 0;
  while (count < 0 || done < count) {
    const size_t at = s.find(old_text, start);
    if (at == std::string_view::npos) break;
    out.append(s.substr(start, at - start)).append(new_text);
    start = at + old_text.size();
    ++done;
  }
  out.append(s.substr(start));
  return out;
}

std::string AsciiUpper(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  }
  return out;
}

std::string AsciiLower(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

std::string PyTitle(std::string_view s) {
  std::string out(s);
  bool previous_cased = false;
  for (char& c : out) {
    const bool upper = c >= 'A' && c <= 'Z', lower = c >= 'a' && c <= 'z';
    if (upper || lower) {
      if (previous_cased && upper) c = static_cast<char>(c - 'A' + 'a');
      if (!previous_cased && lower) c = static_cast<char>(c - 'a' + 'A');
      previous_cased = true;
    } else {
      // Bytes of non-ASCII characters count as cased (most are letters in real text).
      previous_cased = static_cast<uint8_t>(c) >= 0x80;
    }
  }
  return out;
}

std::string PyCapitalize(std::string_view s) {
  std::string out = AsciiLower(s);
  if (!out.empty() && out[0] >= 'a' && out[0] <= 'z') out[0] = static_cast<char>(out[0] - 'a' + 'A');
  return out;
}

std::string PyRepr(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (size_t pos = 0, length = 0; pos < s.size(); pos += length) {
    const char32_t c = DecodeAt(s, pos, &length);
    char buf[16];
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\n') {
      out.append("\\n");
    } else if (c == '\r') {
      out.append("\\r");
    } else if (c == '\t') {
      out.append("\\t");
    } else if (!PyPrintable(c)) {
      if (c <= 0xFF) {
        std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned>(c));
      } else {
        std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
      }
      out.append(buf);
    } else {
      out.append(s.substr(pos, length));
    }
  }
  out.push_back(quote);
  return out;
}

std::string PyFloatRepr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  char buf[64];
  const auto result = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string_view sci(buf, result.ptr - buf);  // e.g. "-1.2345e+02"
  std::string sign;
  if (sci.front() == '-') sign = "-", sci.remove_prefix(1);
  const size_t e_at = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, e_at)) {
    if (c != '.') digits.push_back(c);
  }
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  const int exponent = std::atoi(std::string(sci.substr(e_at + 1)).c_str());
  if (exponent >= -4 && exponent < 16) {
    std::string out = sign;
    if (exponent < 0) {
      out += "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
    } else {
      const size_t whole = static_cast<size_t>(exponent) + 1;
      if (digits.size() <= whole) {
        out += digits + std::string(whole - digits.size(), '0') + ".0";
      } else {
        out += digits.substr(0, whole) + "." + digits.substr(whole);
      }
    }
    return out;
  }
  std::string out = sign + digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  std::snprintf(buf, sizeof(buf), "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
  return out + buf;
}

}  // namespace lazykv::jinja
