// The chat-template lexer: Jinja2's, with the settings Hugging Face transformers renders
// chat templates with (trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False).
//
// - Newlines ("\r\n", "\r") become "\n", and one trailing newline of the template is dropped.
// - Text between tags is one kText token; `{{ }}`, `{% %}` delimit expression tokens
//   (kVariableBegin/End, kBlockBegin/End); `{# #}` comments are dropped.
// - Whitespace control: `{%-`, `{{-`, `{#-` strip all whitespace before the tag, `-%}`,
//   `-}}`, `-#}` all whitespace after it. trim_blocks drops the first newline after `%}` or
//   `#}`; lstrip_blocks drops spaces and tabs between a line's start and `{%` or `{#`.
//   `{%+` / `{#+` keep the leading whitespace, `+%}` / `+#}` the newline.
// - Inside a tag: names, integers, floats, strings ('..' or "..", with Python escapes),
//   operators. `}}` and `%}` inside brackets close the bracket, not the tag (`{{ {'a': {}} }}`).
//
// Offsets are byte offsets into the normalized source; lines count from 1.
// A pure function: safe from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace lazykv::jinja {

struct Token {
  enum class Type : uint8_t {
    kText,
    kVariableBegin,  // {{
    kVariableEnd,    // }}
    kBlockBegin,     // {%
    kBlockEnd,       // %}
    kName,
    kString,    // text holds the decoded value
    kInteger,   // text holds the digits
    kFloat,     // text holds the literal
    kOperator,  // text holds the operator: + - * / // % ** ~ ( ) [ ] { } == != < <= > >= = . , : | ;
    kEnd,
  };
  Type type;
  std::string text;
  size_t offset = 0;
  int line = 1;
};

// The template's tokens, ending with kEnd. INVALID_ARGUMENT for an unclosed tag, comment or
// string, or a character that starts no token, naming the line.
absl::StatusOr<std::vector<Token>> Lex(std::string_view source);

// "\r\n" and "\r" as "\n", less one trailing newline: the text Lex's offsets point into.
std::string NormalizeNewlines(std::string_view source);

}  // namespace lazykv::jinja
