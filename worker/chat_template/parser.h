// Parses a chat template (Jinja2 syntax, the subset Hugging Face chat templates use) into a
// Program. Statements: {% if/elif/else/endif %}, {% for x[, y] in expr [if cond] %} with
// {% else %}, {% set x = expr %}, {% set ns.attr = expr %}, {% set x %}..{% endset %},
// {% macro %}, {% break %}, {% continue %}, {% generation %} (rendered in place, as
// transformers does outside assistant-mask tracking), {% raw %} (in the lexer).
// Expressions: Jinja2's grammar and precedence (literals, lists, dicts, tuples as lists,
// attribute and item access, slices, calls with keyword arguments, filters, tests, the
// arithmetic, comparison and logical operators, `x if c else y`).
//
// Anything else (include, extends, block, call, filter blocks, with, recursive loops,
// *args, unknown filters or tests, ...) is INVALID_ARGUMENT naming the construct, its
// line and offset. Nesting deeper than kMaxParseDepth is INVALID_ARGUMENT too.
// A pure function: safe from any thread.
#pragma once

#include <memory>
#include <string_view>

#include "absl/status/statusor.h"
#include "worker/chat_template/ast.h"

namespace lazykv::jinja {

inline constexpr int kMaxParseDepth = 128;

absl::StatusOr<std::shared_ptr<const Program>> Parse(std::string_view source);

}  // namespace lazykv::jinja
