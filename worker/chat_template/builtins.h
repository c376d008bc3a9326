// The chat-template engine's built-in filters, tests and methods (the ones real chat
// templates use), with Jinja2's and Python's semantics, and transformers' `tojson`
// (json.dumps with ensure_ascii=False: no HTML escaping, optional indent, separators,
// sort_keys).
//
// Filters: abs, capitalize, count, d, default, first, float, indent, int, items, join,
//   last, length, list, lower, map, reject, rejectattr, replace, reverse, safe, select,
//   selectattr, string, title, tojson, trim, unique, upper.
// Tests: boolean, callable, defined, divisibleby, eq, equalto, even, false, float, ge, gt,
//   in, integer, iterable, le, lower, lt, mapping, ne, none, number, odd, sameas, sequence,
//   string, true, undefined, upper (and ==, !=, <, <=, >, >= for select/selectattr).
// Methods: str strip/lstrip/rstrip/split/rsplit/startswith/endswith/upper/lower/title/
//   capitalize/replace/find/join; dict items/keys/values/get.
//
// Stateless functions: safe from any thread.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/chat_template/limits.h"
#include "worker/chat_template/value.h"

namespace lazykv::jinja {

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

bool IsKnownFilter(std::string_view name);
bool IsKnownTest(std::string_view name);

absl::StatusOr<Value> ApplyFilter(std::string_view name, const Value& input, const CallArgs& args,
                                  const RenderLimits& limits);
absl::StatusOr<bool> ApplyTest(std::string_view name, const Value& input, const CallArgs& args);

// object.name(args) for the methods above; anything else is INVALID_ARGUMENT naming it.
absl::StatusOr<Value> CallMethod(const Value& object, std::string_view name, const CallArgs& args,
                                 const RenderLimits& limits);

}  // namespace lazykv::jinja
