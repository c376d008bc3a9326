// Parser's expression half (the Parser class is in parser_internal.h): Jinja2's
// expression grammar by precedence climbing, from `x if c else y` down through or, and,
// not, comparisons and arithmetic to unary operators, primaries (literals, names, lists,
// dicts, parenthesized tuples), postfix access and calls, filters and tests.
#include <cerrno>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "common/status_macros.h"
#include "worker/chat_template/builtins.h"
#include "worker/chat_template/parser_internal.h"
#include "worker/chat_template/str_cat.h"

namespace lazykv::jinja::parser_internal {

// An expression, or several separated by commas (a tuple, made a list).
absl::StatusOr<ExprPtr> Parser::ParseTuple() {
  const Token& start = Cur();
  ASSIGN_OR_RETURN(ExprPtr first, ParseExpression(true));
  if (!IsOp(",")) return first;
  ExprPtr list = NewExpr(Expr::Kind::kList, start);
  list->children.push_back(std::move(first));
  while (IsOp(",")) {
    Advance();
    if (Cur().type == Type::kBlockEnd) break;
    ASSIGN_OR_RETURN(ExprPtr item, ParseExpression(true));
    list->children.push_back(std::move(item));
  }
  return list;
}

absl::StatusOr<ExprPtr> Parser::ParseExpression(bool with_condexpr) {
  DepthGuard guard(this);
  if (guard.too_deep()) return Error(Cur(), "expression nested too deeply");
  ASSIGN_OR_RETURN(ExprPtr e, ParseOr());
  while (with_condexpr && IsName("if")) {
    ExprPtr cond = NewExpr(Expr::Kind::kCond, Cur());
    Advance();
    ASSIGN_OR_RETURN(ExprPtr test, ParseOr());
    ExprPtr otherwise;
    if (IsName("else")) {
      Advance();
      ASSIGN_OR_RETURN(otherwise, ParseExpression(true));
    }
    cond->children.push_back(std::move(test));
    cond->children.push_back(std::move(e));
    cond->children.push_back(std::move(otherwise));
    e = std::move(cond);
  }
  return e;
}

absl::StatusOr<ExprPtr> Parser::Binary(const Token& at, std::string op, ExprPtr left, ExprPtr right) {
  ExprPtr e = NewExpr(Expr::Kind::kBinary, at);
  e->name = std::move(op);
  e->children.push_back(std::move(left));
  e->children.push_back(std::move(right));
  return e;
}

absl::StatusOr<ExprPtr> Parser::ParseOr() {
  ASSIGN_OR_RETURN(ExprPtr e, ParseAnd());
  while (IsName("or")) {
    const Token& at = Cur();
    Advance();
    ASSIGN_OR_RETURN(ExprPtr right, ParseAnd());
    ASSIGN_OR_RETURN(e, Binary(at, "or", std::move(e), std::move(right)));
  }
  return e;
}

absl::StatusOr<ExprPtr> Parser::ParseAnd() {
  ASSIGN_OR_RETURN(ExprPtr e, ParseNot());
  while (IsName("and")) {
    const Token& at = Cur();
    Advance();
    ASSIGN_OR_RETURN(ExprPtr right, ParseNot());
    ASSIGN_OR_RETURN(e, Binary(at, "and", std::move(e), std::move(right)));
  }
  return e;
}

absl::StatusOr<ExprPtr> Parser::ParseNot() {
  if (!IsName("not")) return ParseCompare();
  DepthGuard guard(this);
  if (guard.too_deep()) return Error(Cur(), "expression nested too deeply");
  ExprPtr e = NewExpr(Expr::Kind::kUnary, Cur());
  e->name = "not";
  Advance();
  ASSIGN_OR_RETURN(ExprPtr operand, ParseNot());
  e->children.push_back(std::move(operand));
  return e;
}

absl::StatusOr<ExprPtr> Parser::ParseCompare() {
  const Token& start = Cur();
  ASSIGN_OR_RETURN(ExprPtr first, ParseMath1());
  ExprPtr cmp;
  while (true) {
    std::string op;
    if (Cur().type == Type::kOperator && (Cur().text == "==" || Cur().text == "!=" || Cur().text == "<" ||
                                          Cur().text == "<=" || Cur().text == ">" || Cur().text == ">=")) {
      op = Cur().text;
      Advance();
    } else if (IsName("in")) {
      op = "in";
      Advance();
    } else if (IsName("not") && Peek().type == Type::kName && Peek().text == "in") {
      op = "not in";
      Advance();
      Advance();
    } else {
      break;
    }
    if (!cmp) {
      cmp = NewExpr(Expr::Kind::kCompare, start);
      cmp->children.push_back(std::move(first));
    }
    ASSIGN_OR_RETURN(ExprPtr operand, ParseMath1());
    cmp->ops.push_back(std::move(op));
    cmp->children.push_back(std::move(operand));
  }
  return cmp ? std::move(cmp) : std::move(first);
}

// Left-associative binary operators `ops` over operands parsed by `next`.
template <typename Next>
absl::StatusOr<ExprPtr> Parser::ParseLeft(std::initializer_list<std::string_view> ops, Next next) {
  ASSIGN_OR_RETURN(ExprPtr e, (this->*next)());
  while (true) {
    bool matched = false;
    for (std::string_view op : ops) matched = matched || IsOp(op);
    if (!matched) return e;
    const Token& at = Cur();
    const std::string op = at.text;
    Advance();
    ASSIGN_OR_RETURN(ExprPtr right, (this->*next)());
    ASSIGN_OR_RETURN(e, Binary(at, op, std::move(e), std::move(right)));
  }
}

absl::StatusOr<ExprPtr> Parser::ParseMath1() { return ParseLeft({"+", "-"}, &Parser::ParseConcat); }

absl::StatusOr<ExprPtr> Parser::ParseConcat() { return ParseLeft({"~"}, &Parser::ParseMath2); }

absl::StatusOr<ExprPtr> Parser::ParseMath2() { return ParseLeft({"*", "/", "//", "%"}, &Parser::ParsePow); }

absl::StatusOr<ExprPtr> Parser::ParsePow() { return ParseLeft({"**"}, &Parser::ParseUnaryWithFilters); }

absl::StatusOr<ExprPtr> Parser::ParseUnaryWithFilters() { return ParseUnary(true); }

absl::StatusOr<ExprPtr> Parser::ParseUnary(bool with_filter) {
  DepthGuard guard(this);
  if (guard.too_deep()) return Error(Cur(), "expression nested too deeply");
  ExprPtr e;
  if (IsOp("-") || IsOp("+")) {
    e = NewExpr(Expr::Kind::kUnary, Cur());
    e->name = Cur().text;
    Advance();
    ASSIGN_OR_RETURN(ExprPtr operand, ParseUnary(false));
    e->children.push_back(std::move(operand));
  } else {
    ASSIGN_OR_RETURN(e, ParsePrimary());
  }
  ASSIGN_OR_RETURN(e, ParsePostfix(std::move(e)));
  if (with_filter) return ParseFilterExpr(std::move(e));
  return e;
}

absl::StatusOr<ExprPtr> Parser::ParsePrimary() {
  const Token& t = Cur();
  switch (t.type) {
    case Type::kName: {
      ExprPtr e = NewExpr(Expr::Kind::kLiteral, t);
      if (t.text == "true" || t.text == "True") {
        e->literal = Value::Bool(true);
      } else if (t.text == "false" || t.text == "False") {
        e->literal = Value::Bool(false);
      } else if (t.text == "none" || t.text == "None") {
        e->literal = Value::None();
      } else {
        e->kind = Expr::Kind::kName;
        e->name = t.text;
      }
      Advance();
      return e;
    }
    case Type::kString: {
      ExprPtr e = NewExpr(Expr::Kind::kLiteral, t);
      std::string s;
      while (Cur().type == Type::kString) {  // adjacent literals concatenate, as in Python
        s += Cur().text;
        Advance();
      }
      e->literal = Value::String(std::move(s));
      return e;
    }
    case Type::kInteger: {
      ExprPtr e = NewExpr(Expr::Kind::kLiteral, t);
      errno = 0;
      const long long v = std::strtoll(t.text.c_str(), nullptr, 10);
      if (errno == ERANGE) return Error(t, Cat("integer literal ", t.text, " out of the 64-bit range"));
      e->literal = Value::Int(v);
      Advance();
      return e;
    }
    case Type::kFloat: {
      ExprPtr e = NewExpr(Expr::Kind::kLiteral, t);
      e->literal = Value::Float(std::strtod(t.text.c_str(), nullptr));
      Advance();
      return e;
    }
    case Type::kOperator:
      if (t.text == "(") return ParseParenthesized();
      if (t.text == "[") return ParseList();
      if (t.text == "{") return ParseDict();
      [[fallthrough]];
    default:
      return Error(t, Cat("unexpected ", Describe(t), " in an expression"));
  }
}

absl::StatusOr<ExprPtr> Parser::ParseParenthesized() {
  const Token& open = Cur();
  Advance();
  if (IsOp(")")) {
    Advance();
    return NewExpr(Expr::Kind::kList, open);  // ()
  }
  ASSIGN_OR_RETURN(ExprPtr e, ParseExpression(true));
  if (IsOp(",")) {  // a tuple
    ExprPtr list = NewExpr(Expr::Kind::kList, open);
    list->children.push_back(std::move(e));
    while (IsOp(",")) {
      Advance();
      if (IsOp(")")) break;
      ASSIGN_OR_RETURN(ExprPtr item, ParseExpression(true));
      list->children.push_back(std::move(item));
    }
    e = std::move(list);
  }
  RETURN_IF_ERROR(ExpectOp(")", "to close '('"));
  return e;
}

absl::StatusOr<ExprPtr> Parser::ParseList() {
  ExprPtr list = NewExpr(Expr::Kind::kList, Cur());
  Advance();
  while (!IsOp("]")) {
    ASSIGN_OR_RETURN(ExprPtr item, ParseExpression(true));
    list->children.push_back(std::move(item));
    if (!IsOp(",")) break;
    Advance();
  }
  RETURN_IF_ERROR(ExpectOp("]", "to close '['"));
  return list;
}

absl::StatusOr<ExprPtr> Parser::ParseDict() {
  ExprPtr dict = NewExpr(Expr::Kind::kDict, Cur());
  Advance();
  while (!IsOp("}")) {
    ASSIGN_OR_RETURN(ExprPtr key, ParseExpression(true));
    RETURN_IF_ERROR(ExpectOp(":", "after a dict key"));
    ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
    dict->children.push_back(std::move(key));
    dict->children.push_back(std::move(value));
    if (!IsOp(",")) break;
    Advance();
  }
  RETURN_IF_ERROR(ExpectOp("}", "to close '{'"));
  return dict;
}

absl::StatusOr<ExprPtr> Parser::ParsePostfix(ExprPtr e) {
  while (true) {
    const Token& at = Cur();
    if (IsOp(".")) {
      Advance();
      if (Cur().type == Type::kInteger) {  // x.0 is x[0]
        ExprPtr item = NewExpr(Expr::Kind::kGetItem, at);
        ExprPtr index = NewExpr(Expr::Kind::kLiteral, Cur());
        index->literal = Value::Int(std::strtoll(Cur().text.c_str(), nullptr, 10));
        Advance();
        item->children.push_back(std::move(e));
        item->children.push_back(std::move(index));
        e = std::move(item);
        continue;
      }
      ExprPtr attr = NewExpr(Expr::Kind::kGetAttr, at);
      ASSIGN_OR_RETURN(attr->name, ExpectName("an attribute name after '.'"));
      attr->children.push_back(std::move(e));
      e = std::move(attr);
    } else if (IsOp("[")) {
      Advance();
      ASSIGN_OR_RETURN(e, ParseSubscript(at, std::move(e)));
    } else if (IsOp("(")) {
      ASSIGN_OR_RETURN(e, ParseCall(Expr::Kind::kCall, at, "", std::move(e)));
    } else {
      return e;
    }
  }
}

// After `[`: an index or a slice, then `]`.
absl::StatusOr<ExprPtr> Parser::ParseSubscript(const Token& at, ExprPtr object) {
  ExprPtr parts[3];
  int colons = 0;
  for (int i = 0; i < 3; ++i) {
    if (!IsOp(":") && !IsOp("]")) {
      ASSIGN_OR_RETURN(parts[i], ParseExpression(true));
    }
    if (i < 2 && IsOp(":")) {
      ++colons;
      Advance();
    } else {
      break;
    }
  }
  if (IsOp(",")) return Error(Cur(), "unsupported: tuple subscripts (x[a, b])");
  RETURN_IF_ERROR(ExpectOp("]", "to close '['"));
  if (colons == 0) {
    if (!parts[0]) return Error(at, "empty subscript '[]'");
    ExprPtr item = NewExpr(Expr::Kind::kGetItem, at);
    item->children.push_back(std::move(object));
    item->children.push_back(std::move(parts[0]));
    return item;
  }
  ExprPtr slice = NewExpr(Expr::Kind::kSlice, at);
  slice->children.push_back(std::move(object));
  for (ExprPtr& part : parts) slice->children.push_back(std::move(part));
  return slice;
}

// At `(`: arguments, then `)`, into a node of `kind` whose children[0] is `subject`.
absl::StatusOr<ExprPtr> Parser::ParseCall(Expr::Kind kind, const Token& at, std::string name, ExprPtr subject) {
  ExprPtr call = NewExpr(kind, at);
  call->name = std::move(name);
  call->children.push_back(std::move(subject));
  if (!IsOp("(")) return call;
  Advance();
  while (!IsOp(")")) {
    if (IsOp("*") || IsOp("**")) return Error(Cur(), "unsupported: *args and **kwargs in calls");
    if (Cur().type == Type::kName && Peek().type == Type::kOperator && Peek().text == "=") {
      std::string key = Cur().text;
      Advance();
      Advance();
      ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
      call->kwargs.emplace_back(std::move(key), std::move(value));
    } else {
      if (!call->kwargs.empty()) return Error(Cur(), "a positional argument after a keyword argument");
      ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
      call->children.push_back(std::move(value));
    }
    if (!IsOp(",")) break;
    Advance();
  }
  RETURN_IF_ERROR(ExpectOp(")", "to close the argument list"));
  return call;
}

absl::StatusOr<ExprPtr> Parser::ParseFilterExpr(ExprPtr e) {
  while (true) {
    const Token& at = Cur();
    if (IsOp("|")) {
      Advance();
      const Token& name = Cur();
      ASSIGN_OR_RETURN(std::string filter, ExpectName("a filter name after '|'"));
      if (!IsKnownFilter(filter)) return Error(name, Cat("unknown filter '", filter, "'"));
      ASSIGN_OR_RETURN(e, ParseCall(Expr::Kind::kFilter, at, std::move(filter), std::move(e)));
    } else if (IsName("is")) {
      Advance();
      bool negated = false;
      if (IsName("not")) {
        negated = true;
        Advance();
      }
      const Token& name = Cur();
      ASSIGN_OR_RETURN(std::string test, ExpectName("a test name after 'is'"));
      if (!IsKnownTest(test)) return Error(name, Cat("unknown test '", test, "'"));
      ExprPtr node;
      if (IsOp("(")) {
        ASSIGN_OR_RETURN(node, ParseCall(Expr::Kind::kTest, at, std::move(test), std::move(e)));
      } else {
        node = NewExpr(Expr::Kind::kTest, at);
        node->name = std::move(test);
        node->children.push_back(std::move(e));
        const Type type = Cur().type;
        const bool argument_follows = (type == Type::kName || type == Type::kString || type == Type::kInteger ||
                                       type == Type::kFloat || IsOp("[") || IsOp("{")) &&
                                      !IsName("else") && !IsName("or") && !IsName("and");
        if (argument_follows) {
          if (IsName("is")) return Error(Cur(), "tests cannot be chained with 'is'");
          ASSIGN_OR_RETURN(ExprPtr argument, ParsePrimary());
          ASSIGN_OR_RETURN(argument, ParsePostfix(std::move(argument)));
          node->children.push_back(std::move(argument));
        }
      }
      node->negated = negated;
      e = std::move(node);
    } else if (IsOp("(")) {
      ASSIGN_OR_RETURN(e, ParseCall(Expr::Kind::kCall, at, "", std::move(e)));
    } else {
      return e;
    }
  }
}

}  // namespace lazykv::jinja::parser_internal
