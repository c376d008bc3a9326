// The chat-template syntax tree the parser builds and the evaluator walks. Immutable once
// parsed: a Program may be rendered from any number of threads.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "worker/chat_template/value.h"

namespace lazykv::jinja {

struct Expr;
struct Node;
using ExprPtr = std::unique_ptr<Expr>;
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;

struct Expr {
  enum class Kind : uint8_t {
    kLiteral,  // literal
    kName,     // name
    kList,     // children: items (tuples too)
    kDict,     // children: key, value, key, value, ...
    kGetAttr,  // children[0].name
    kGetItem,  // children[0][children[1]]
    kSlice,    // children[0][children[1]:children[2]:children[3]] (each bound may be null)
    kUnary,    // name: "-", "+" or "not"; children[0]
    kBinary,   // name: + - * / // % ** ~ and or; children[0], children[1]
    kCompare,  // children[0] ops[0] children[1] ops[1] ...; ops: == != < <= > >= in "not in"
    kCond,     // children[1] if children[0] else children[2] (may be null: undefined)
    kCall,     // children[0](children[1..], kwargs)
    kFilter,   // children[0] | name(children[1..], kwargs)
    kTest,     // children[0] is [not] name(children[1..])
  };
  Kind kind;
  size_t offset = 0;
  int line = 1;
  Value literal;
  std::string name;
  std::vector<std::string> ops;
  std::vector<ExprPtr> children;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  bool negated = false;  // kTest: `is not`
};

// {% macro name(params) %}body{% endmacro %}
struct MacroNode {
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // one per param; null: none
  Body body;
  int line = 1;
};

struct Node {
  enum class Kind : uint8_t {
    kText,      // text
    kOutput,    // {{ expr }}
    kIf,        // branches (condition, body); else_body
    kFor,       // {% for targets in expr [if filter] %}body{% else %}else_body{% endfor %}
    kSet,       // {% set target[.attribute] = expr %}; several targets unpack a list
    kSetBlock,  // {% set target %}body{% endset %}
    kMacro,     // macro
    kBreak,
    kContinue,
    kScope,  // a body rendered in place: {% generation %} (transformers' assistant-mask tag)
  };
  Kind kind;
  size_t offset = 0;
  int line = 1;
  std::string text;
  ExprPtr expr;
  std::vector<std::pair<ExprPtr, Body>> branches;
  std::vector<std::string> targets;
  std::string attribute;
  ExprPtr filter;
  Body body;
  Body else_body;
  std::unique_ptr<MacroNode> macro;
};

struct Program {
  Body body;
};

}  // namespace lazykv::jinja
