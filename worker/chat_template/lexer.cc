#include "worker/chat_template/lexer.h"

#include <algorithm>

#include "absl/status/status.h"
#include "worker/chat_template/py_string.h"
#include "worker/chat_template/str_cat.h"

namespace lazykv::jinja {

std::string NormalizeNewlines(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out.push_back(source[i]);
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

namespace {

bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsNameChar(char c) { return IsNameStart(c) || IsDigit(c); }
bool IsTagSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

class Lexer {
 public:
  explicit Lexer(std::string source) : src_(std::move(source)) {
    for (size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\n') newlines_.push_back(i);
    }
  }

  absl::StatusOr<std::vector<Token>> Run() {
    size_t pos = 0;
    bool line_starting = true;
    while (true) {
      const size_t open = FindOpener(pos);
      if (open == std::string::npos) {
        Emit(Token::Type::kText, src_.substr(pos), pos);
        break;
      }
      const char kind = src_[open + 1];
      size_t p = open + 2;
      char sign = 0;
      if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) sign = src_[p++];
      const bool raw = kind == '%' && IsRawBegin(p);
      Emit(Token::Type::kText, StripBefore(src_.substr(pos, open - pos), sign, kind != '{', line_starting), pos);
      if (raw) {
        absl::StatusOr<size_t> end = LexRaw(open, p);
        if (!end.ok()) return end.status();
        pos = *end;
      } else if (kind == '#') {
        size_t q = src_.find("#}", p);
        if (q == std::string::npos) return Error(open, "unclosed comment '{#'");
        char end_sign = 0;
        if (q > p && (src_[q - 1] == '-' || src_[q - 1] == '+')) end_sign = src_[q - 1];
        pos = StripAfter(q + 2, end_sign, /*trim_newline=*/true);
      } else {
        absl::StatusOr<size_t> end = LexTag(open, p, kind == '{');
        if (!end.ok()) return end.status();
        pos = *end;
      }
      line_starting = pos > 0 && src_[pos - 1] == '\n';
    }
    tokens_.push_back(Token{Token::Type::kEnd, "", src_.size(), LineOf(src_.size())});
    return std::move(tokens_);
  }

 private:
  int LineOf(size_t offset) const {
    return 1 + static_cast<int>(std::lower_bound(newlines_.begin(), newlines_.end(), offset) - newlines_.begin());
  }

  absl::Status Error(size_t offset, std::string_view what) const {
    return absl::InvalidArgumentError(Cat("chat template line ", LineOf(offset), " (offset ", offset, "): ", what));
  }

  void Emit(Token::Type type, std::string text, size_t offset) {
    if (type == Token::Type::kText && text.empty()) return;
    tokens_.push_back(Token{type, std::move(text), offset, LineOf(offset)});
  }

  size_t FindOpener(size_t pos) const {
    for (size_t i = src_.find('{', pos); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    }
    return std::string::npos;
  }

  // The text before a tag, with whitespace control applied (Jinja2's OptionalLStrip).
  static std::string StripBefore(std::string text, char sign, bool block_or_comment, bool line_starting) {
    if (sign == '-') return PyStrip(text, std::nullopt, false, true);
    if (sign == '+' || !block_or_comment) return text;
    const size_t line_start = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
    if (line_start == 0 && !line_starting) return text;
    size_t length = 0;
    for (size_t i = line_start; i < text.size(); i += length) {
      if (!IsPySpace(DecodeAt(text, i, &length))) return text;
    }
    text.resize(line_start);
    return text;
  }

  // Where the text after a tag's end (at `pos`) starts.
  size_t StripAfter(size_t pos, char sign, bool trim_newline) const {
    if (sign == '-') {
      size_t length = 0;
      while (pos < src_.size() && IsPySpace(DecodeAt(src_, pos, &length))) pos += length;
    } else if (sign != '+' && trim_newline && pos < src_.size() && src_[pos] == '\n') {
      ++pos;
    }
    return pos;
  }

  // Whether `raw` then `%}` (or `-%}`) follows `{%`, spaces between.
  bool IsRawBegin(size_t p) const {
    while (p < src_.size() && IsTagSpace(src_[p])) ++p;
    if (src_.compare(p, 3, "raw") != 0 || (p + 3 < src_.size() && IsNameChar(src_[p + 3]))) return false;
    p += 3;
    while (p < src_.size() && IsTagSpace(src_[p])) ++p;
    return src_.compare(p, 2, "%}") == 0 || src_.compare(p, 3, "-%}") == 0;
  }

  // {% raw %}...{% endraw %}: the text between as is. Returns the offset after endraw.
  absl::StatusOr<size_t> LexRaw(size_t open, size_t p) {
    size_t end = src_.find("%}", p);
    const bool strip = src_[end - 1] == '-';
    size_t body = end + 2;
    if (strip) body = StripAfter(body, '-', false);
    for (size_t q = src_.find("{%", body); q != std::string::npos; q = src_.find("{%", q + 1)) {
      size_t r = q + 2;
      char sign = 0;
      if (r < src_.size() && (src_[r] == '-' || src_[r] == '+')) sign = src_[r++];
      while (r < src_.size() && IsTagSpace(src_[r])) ++r;
      if (src_.compare(r, 6, "endraw") != 0) continue;
      r += 6;
      while (r < src_.size() && IsTagSpace(src_[r])) ++r;
      char end_sign = 0;
      if (r < src_.size() && (src_[r] == '-' || src_[r] == '+')) end_sign = src_[r++];
      if (src_.compare(r, 2, "%}") != 0) continue;
      const bool line_start = body > 0 && src_[body - 1] == '\n';
      Emit(Token::Type::kText, StripBefore(src_.substr(body, q - body), sign, true, line_start), body);
      return StripAfter(r + 2, end_sign, true);
    }
    return Error(open, "unclosed '{% raw %}' (no '{% endraw %}')");
  }

  // The tokens of a {{ }} or {% %} tag whose contents start at `p`. Returns the offset after it.
  absl::StatusOr<size_t> LexTag(size_t open, size_t p, bool variable) {
    Emit(variable ? Token::Type::kVariableBegin : Token::Type::kBlockBegin, variable ? "{{" : "{%", open);
    std::string brackets;
    const char* const close = variable ? "}}" : "%}";
    while (true) {
      while (p < src_.size() && IsTagSpace(src_[p])) ++p;
      if (p >= src_.size()) {
        return Error(open, Cat("unclosed '", variable ? "{{" : "{%", "': no '", close, "' before the end"));
      }
      if (brackets.empty()) {
        const Token::Type end_type = variable ? Token::Type::kVariableEnd : Token::Type::kBlockEnd;
        if (src_.compare(p, 2, close) == 0) {
          Emit(end_type, close, p);
          return StripAfter(p + 2, 0, !variable);
        }
        if ((src_[p] == '-' || (!variable && src_[p] == '+')) && src_.compare(p + 1, 2, close) == 0) {
          Emit(end_type, close, p);
          return StripAfter(p + 3, src_[p], !variable);
        }
      }
      const char c = src_[p];
      const size_t start = p;
      if (IsDigit(c)) {
        absl::StatusOr<size_t> end = LexNumber(p);
        if (!end.ok()) return end.status();
        p = *end;
      } else if (IsNameStart(c)) {
        while (p < src_.size() && IsNameChar(src_[p])) ++p;
        Emit(Token::Type::kName, src_.substr(start, p - start), start);
      } else if (c == '\'' || c == '"') {
        absl::StatusOr<size_t> end = LexString(p);
        if (!end.ok()) return end.status();
        p = *end;
      } else {
        static constexpr std::string_view kTwo[] = {"//", "**", "==", "!=", ">=", "<="};
        std::string op;
        for (std::string_view two : kTwo) {
          if (src_.compare(p, 2, two) == 0) op = two;
        }
        if (op.empty() && std::string_view("+-*/%~()[]{}<>=.,:|;").find(c) != std::string_view::npos) op = c;
        if (op.empty()) return Error(p, Cat("unexpected character '", std::string(1, c), "' in a tag"));
        if (c == '(' || c == '[' || c == '{') {
          brackets.push_back(c == '(' ? ')' : (c == '[' ? ']' : '}'));
        } else if (c == ')' || c == ']' || c == '}') {
          if (brackets.empty() || brackets.back() != c) {
            return Error(p, Cat("unexpected '", std::string(1, c), "'"));
          }
          brackets.pop_back();
        }
        p += op.size();
        Emit(Token::Type::kOperator, std::move(op), start);
      }
    }
  }

  absl::StatusOr<size_t> LexNumber(size_t p) {
    const size_t start = p;
    auto digits = [&] {
      while (p < src_.size() && (IsDigit(src_[p]) || (src_[p] == '_' && p + 1 < src_.size() && IsDigit(src_[p + 1]))))
        ++p;
    };
    digits();
    bool is_float = false;
    const bool after_dot = start > 0 && src_[start - 1] == '.';  // x.0.1: integers (Jinja2's (?<!\.))
    if (!after_dot && p + 1 < src_.size() && src_[p] == '.' && IsDigit(src_[p + 1])) {
      ++p;
      digits();
      is_float = true;
    }
    if (!after_dot && p < src_.size() && (src_[p] == 'e' || src_[p] == 'E')) {
      size_t q = p + 1;
      if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
      if (q < src_.size() && IsDigit(src_[q])) {
        p = q;
        digits();
        is_float = true;
      }
    }
    std::string text;
    for (size_t i = start; i < p; ++i) {
      if (src_[i] != '_') text.push_back(src_[i]);
    }
    Emit(is_float ? Token::Type::kFloat : Token::Type::kInteger, std::move(text), start);
    return p;
  }

  static int HexValue(char c) {
    if (IsDigit(c)) return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }

  // A quoted string with Python's escapes (\n \t \\ \' \" \xhh \uhhhh \Uhhhhhhhh, octal, ...).
  absl::StatusOr<size_t> LexString(size_t p) {
    const size_t start = p;
    const char quote = src_[p++];
    std::string value;
    while (true) {
      if (p >= src_.size()) return Error(start, "unterminated string literal");
      const char c = src_[p];
      if (c == quote) break;
      if (c != '\\') {
        value.push_back(c);
        ++p;
        continue;
      }
      if (p + 1 >= src_.size()) return Error(start, "unterminated string literal");
      const char e = src_[p + 1];
      p += 2;
      switch (e) {
        case '\n':
          break;
        case 'n':
          value.push_back('\n');
          break;
        case 't':
          value.push_back('\t');
          break;
        case 'r':
          value.push_back('\r');
          break;
        case 'b':
          value.push_back('\b');
          break;
        case 'f':
          value.push_back('\f');
          break;
        case 'v':
          value.push_back('\v');
          break;
        case 'a':
          value.push_back('\a');
          break;
        case '\\':
        case '\'':
        case '"':
          value.push_back(e);
          break;
        case 'x':
        case 'u':
        case 'U': {
          const int width = e == 'x' ? 2 : (e == 'u' ? 4 : 8);
          char32_t code = 0;
          for (int i = 0; i < width; ++i) {
            const int h = p < src_.size() ? HexValue(src_[p]) : -1;
            if (h < 0) return Error(p, Cat("truncated \\", std::string(1, e), " escape in a string"));
            code = code * 16 + static_cast<char32_t>(h);
            ++p;
          }
          if (code > 0x10FFFF) return Error(p, "escape out of the Unicode range in a string");
          AppendUtf8(code, &value);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            char32_t code = static_cast<char32_t>(e - '0');
            for (int i = 0; i < 2 && p < src_.size() && src_[p] >= '0' && src_[p] <= '7'; ++i, ++p) {
              code = code * 8 + static_cast<char32_t>(src_[p] - '0');
            }
            AppendUtf8(code, &value);
          } else {  // unknown escapes stay as written, as in Python
            value.push_back('\\');
            value.push_back(e);
          }
      }
    }
    Emit(Token::Type::kString, std::move(value), start);
    return p + 1;
  }

  std::string src_;
  std::vector<size_t> newlines_;
  std::vector<Token> tokens_;
};

}  // namespace

absl::StatusOr<std::vector<Token>> Lex(std::string_view source) { return Lexer(NormalizeNewlines(source)).Run(); }

}  // namespace lazykv::jinja
