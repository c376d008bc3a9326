// The chat-template engine's operators, with Python's and Jinja2's semantics on Values:
// arithmetic, `~`, `in`, attribute and item access, slices, iteration. Errors are
// INVALID_ARGUMENT (a type error, division by zero, integer overflow) or
// RESOURCE_EXHAUSTED (a string or list beyond the render's limits); the evaluator adds the
// template line. Stateless: safe from any thread.
#pragma once

#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/chat_template/limits.h"
#include "worker/chat_template/value.h"

namespace lazykv::jinja {

// op: + - * / // % **
absl::StatusOr<Value> Arithmetic(std::string_view op, const Value& a, const Value& b, const RenderLimits& limits);
absl::StatusOr<Value> Negate(const Value& v);
// a ~ b: both as str.
absl::StatusOr<Value> Concat(const Value& a, const Value& b, const RenderLimits& limits);
// `needle in haystack`: substring, list member, dict key; undefined holds nothing.
absl::StatusOr<bool> Contains(const Value& haystack, const Value& needle);

// x.name (Jinja2's getattr: a dict's item, a namespace's attribute). Missing: undefined
// with a hint; on undefined: INVALID_ARGUMENT ("'x' is undefined").
absl::StatusOr<Value> GetAttr(const Value& object, std::string_view name);
// x[key] (Jinja2's getitem: a list's or str's index, negative from the end, a dict's key).
// Missing or out of range: undefined; on undefined: INVALID_ARGUMENT.
absl::StatusOr<Value> GetItem(const Value& object, const Value& key);
// x[start:stop:step] on a list or str (by code point); bounds are int or None.
absl::StatusOr<Value> Slice(const Value& object, const Value& start, const Value& stop, const Value& step);

// The items a for loop visits: a list's items, a dict's keys, a str's characters;
// undefined gives none. Anything else is INVALID_ARGUMENT.
absl::StatusOr<std::vector<Value>> Iterate(const Value& v);

// INVALID_ARGUMENT naming `what` when v is undefined (using an undefined value as an operand).
absl::Status CheckDefined(const Value& v);

}  // namespace lazykv::jinja
