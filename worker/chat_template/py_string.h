// Python str semantics over UTF-8 bytes, for the chat-template engine: what Jinja2 templates
// see when they call str methods (strip, split, indexing by code point, ...). Strings are
// UTF-8; a byte that does not start a well-formed sequence counts as one code point of its
// own (never an error), so any bytes are handled.
//
// Case mapping (Upper, Lower, Title, Capitalize) covers ASCII letters only: other characters
// are left as they are, where Python would map them (e.g. "é".upper() is "É" in Python).
//
// Stateless functions: safe from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace lazykv::jinja {

// str.isspace() for one code point: the characters Python strips and splits on.
bool IsPySpace(char32_t c);

// Decodes the code point at s[pos] and its length in bytes (1 for a malformed byte).
char32_t DecodeAt(std::string_view s, size_t pos, size_t* length);
void AppendUtf8(char32_t c, std::string* out);

// Byte offsets of each code point's start, plus s.size() at the end.
std::vector<size_t> CodePointOffsets(std::string_view s);
size_t CodePointCount(std::string_view s);

// str.strip / lstrip / rstrip: `chars` absent strips whitespace, else any of its code points.
std::string PyStrip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right);

// str.split(sep=None, maxsplit=-1) and str.rsplit: on runs of whitespace (dropping empty
// pieces) when sep is absent; else on each occurrence of a non-empty sep.
std::vector<std::string> PySplit(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit);

// str.replace(old, new, count=-1); an empty `old` inserts `new` around every code point.
std::string PyReplace(std::string_view s, std::string_view old_text, std::string_view new_text, int64_t count);

std::string AsciiUpper(std::string_view s);
std::string AsciiLower(std::string_view s);
std::string PyTitle(std::string_view s);       // first letter of each run of letters upper, the rest lower
std::string PyCapitalize(std::string_view s);  // first character upper, the rest lower

// Python's repr() of a str: quoted with ' (or " when the text holds ' and no "), with
// \\, \n, \r, \t and other control characters escaped.
std::string PyRepr(std::string_view s);

// Python's repr() of a float: the shortest round-tripping digits, in fixed notation when the
// exponent is in [-4, 16), else scientific (1e+16, 1.5e-05); "inf", "-inf", "nan".
std::string PyFloatRepr(double d);

}  // namespace lazykv::jinja
