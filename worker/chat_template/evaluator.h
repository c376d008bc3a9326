// Renders a parsed chat template (parser.h) with Jinja2's semantics:
// - scoping: each for-loop iteration has its own scope (a `set` inside a loop does not
//   leak out, nor into the next iteration); if-blocks share their enclosing scope; a
//   macro's body sees its arguments and the template's top-level variables at call time;
//   namespace() objects are shared, so `{% set ns.x = 1 %}` inside a loop is seen after it;
// - undefined values print as "", are false, iterate as empty, and are an error when used
//   as an operand, called, or looked into (`x.y` where x is undefined);
// - `loop` has index, index0, revindex, revindex0, first, last, length, previtem,
//   nextitem, depth, depth0; `{% for x in xs if cond %}` filters before counting;
// - globals: namespace(), raise_exception(msg), range(), dict(), strftime_now(fmt)
//   (transformers' helpers), shadowed by variables of the same name.
//
// Errors name the template line: INVALID_ARGUMENT for type errors, undefined values and
// raise_exception (its message is also in RaisedMessage), RESOURCE_EXHAUSTED past
// RenderLimits. Render is a pure function of its arguments: any number of threads may
// render one Program at once.
#pragma once

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "worker/chat_template/ast.h"
#include "worker/chat_template/limits.h"
#include "worker/chat_template/value.h"

namespace lazykv::jinja {

absl::StatusOr<std::string> Render(const Program& program, const Dict& variables, const RenderLimits& limits);

// The message a template passed to raise_exception(), when `status` came from one.
std::optional<std::string> RaisedMessage(const absl::Status& status);

}  // namespace lazykv::jinja
