#include "worker/chat_template/parser.h"

#include <cerrno>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/status_macros.h"
#include "worker/chat_template/builtins.h"
#include "worker/chat_template/lexer.h"
#include "worker/chat_template/str_cat.h"

namespace lazykv::jinja {
namespace {

using Type = Token::Type;

std::string JoinNames(std::initializer_list<std::string_view> names) {
  std::string out;
  for (std::string_view name : names) out += Cat(out.empty() ? "" : " or ", "'{% ", name, " %}'");
  return out;
}

std::string Describe(const Token& t) {
  switch (t.type) {
    case Type::kEnd:
      return "the end of the template";
    case Type::kText:
      return "text";
    case Type::kString:
      return "a string";
    default:
      return Cat("'", t.text, "'");
  }
}

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  absl::StatusOr<std::shared_ptr<const Program>> Run() {
    auto program = std::make_shared<Program>();
    std::string ended_by;
    RETURN_IF_ERROR(ParseBody({}, nullptr, &program->body, &ended_by));
    return program;
  }

 private:
  // Bounds recursion: each nested expression or statement holds one.
  class DepthGuard {
   public:
    explicit DepthGuard(Parser* p) : p_(p) { ++p_->depth_; }
    ~DepthGuard() { --p_->depth_; }
    bool too_deep() const { return p_->depth_ > kMaxParseDepth; }

   private:
    Parser* p_;
  };

  const Token& Cur() const { return tokens_[pos_]; }
  const Token& Peek() const { return tokens_[pos_ + 1 < tokens_.size() ? pos_ + 1 : pos_]; }
  void Advance() {
    if (pos_ + 1 < tokens_.size()) ++pos_;
  }
  bool IsOp(std::string_view op) const { return Cur().type == Type::kOperator && Cur().text == op; }
  bool IsName(std::string_view name) const { return Cur().type == Type::kName && Cur().text == name; }

  absl::Status Error(const Token& t, std::string_view what) const {
    return absl::InvalidArgumentError(Cat("chat template line ", t.line, " (offset ", t.offset, "): ", what));
  }
  absl::Status ExpectOp(std::string_view op, std::string_view context) {
    if (!IsOp(op)) return Error(Cur(), Cat("expected '", op, "' ", context, ", got ", Describe(Cur())));
    Advance();
    return absl::OkStatus();
  }
  absl::Status ExpectBlockEnd(std::string_view tag) {
    if (Cur().type != Type::kBlockEnd) {
      return Error(Cur(), Cat("expected '%}' to end the '", tag, "' tag, got ", Describe(Cur())));
    }
    Advance();
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> ExpectName(std::string_view what) {
    if (Cur().type != Type::kName) return Error(Cur(), Cat("expected ", what, ", got ", Describe(Cur())));
    std::string name = Cur().text;
    Advance();
    return name;
  }

  ExprPtr NewExpr(Expr::Kind kind, const Token& at) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->offset = at.offset;
    e->line = at.line;
    return e;
  }
  NodePtr NewNode(Node::Kind kind, const Token& at) {
    auto n = std::make_unique<Node>();
    n->kind = kind;
    n->offset = at.offset;
    n->line = at.line;
    return n;
  }

  // Nodes until `{% <one of end_names>` (then pos_ is past that name and *ended_by says
  // which) or, when end_names is empty, the end of the template.
  absl::Status ParseBody(std::initializer_list<std::string_view> end_names, const Token* opener, Body* body,
                         std::string* ended_by) {
    DepthGuard guard(this);
    if (guard.too_deep()) return Error(Cur(), "statements nested too deeply");
    while (true) {
      const Token& t = Cur();
      switch (t.type) {
        case Type::kText: {
          NodePtr node = NewNode(Node::Kind::kText, t);
          node->text = t.text;
          body->push_back(std::move(node));
          Advance();
          break;
        }
        case Type::kVariableBegin: {
          NodePtr node = NewNode(Node::Kind::kOutput, t);
          Advance();
          ASSIGN_OR_RETURN(node->expr, ParseExpression(true));
          if (Cur().type != Type::kVariableEnd) {
            return Error(Cur(), Cat("expected '}}' to end the expression, got ", Describe(Cur())));
          }
          Advance();
          body->push_back(std::move(node));
          break;
        }
        case Type::kBlockBegin: {
          const Token& name = Peek();
          if (name.type != Type::kName) return Error(name, "expected a tag name after '{%'");
          for (std::string_view end : end_names) {
            if (name.text == end) {
              *ended_by = name.text;
              Advance();
              Advance();
              return absl::OkStatus();
            }
          }
          RETURN_IF_ERROR(ParseStatement(end_names, opener, body));
          break;
        }
        case Type::kEnd:
          if (end_names.size() == 0) return absl::OkStatus();
          return Error(*opener, Cat("unclosed '{% ", opener->text, " %}': expected '{% ", *(end_names.end() - 1),
                                    " %}' before the end of the template"));
        default:
          return Error(t, Cat("unexpected ", Describe(t)));
      }
    }
  }

  // At `{%`, a tag that is not one of the enclosing body's end tags.
  absl::Status ParseStatement(std::initializer_list<std::string_view> end_names, const Token* opener, Body* body) {
    const Token& begin = Cur();
    Advance();
    const Token& tag = Cur();
    const std::string name = tag.text;
    Advance();
    if (name == "if") return ParseIf(tag, body);
    if (name == "for") return ParseFor(tag, body);
    if (name == "set") return ParseSet(tag, body);
    if (name == "macro") return ParseMacro(tag, body);
    if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) return Error(tag, Cat("'", name, "' outside a for loop"));
      body->push_back(NewNode(name == "break" ? Node::Kind::kBreak : Node::Kind::kContinue, tag));
      return ExpectBlockEnd(name);
    }
    if (name == "generation") {
      NodePtr node = NewNode(Node::Kind::kScope, tag);
      RETURN_IF_ERROR(ExpectBlockEnd(name));
      std::string ended;
      RETURN_IF_ERROR(ParseBody({"endgeneration"}, &tag, &node->body, &ended));
      body->push_back(std::move(node));
      return ExpectBlockEnd("endgeneration");
    }
    static constexpr std::string_view kEnds[] = {"endif",  "endfor",   "else",          "elif",
                                                 "endset", "endmacro", "endgeneration", "endraw"};
    for (std::string_view end : kEnds) {
      if (name == end) {
        if (end_names.size() == 0) return Error(tag, Cat("unexpected '{% ", name, " %}' (nothing to close)"));
        return Error(tag, Cat("unexpected '{% ", name, " %}' inside '{% ", opener->text, " %}' (expected ",
                              JoinNames(end_names), ")"));
      }
    }
    (void)begin;
    return Error(tag, Cat("unsupported tag '", name, "'"));
  }

  absl::Status ParseIf(const Token& tag, Body* body) {
    NodePtr node = NewNode(Node::Kind::kIf, tag);
    std::string ended = "elif";
    while (ended == "elif") {
      ASSIGN_OR_RETURN(ExprPtr condition, ParseExpression(true));
      RETURN_IF_ERROR(ExpectBlockEnd(ended == "elif" ? "if" : ended));
      Body branch;
      RETURN_IF_ERROR(ParseBody({"elif", "else", "endif"}, &tag, &branch, &ended));
      node->branches.emplace_back(std::move(condition), std::move(branch));
    }
    if (ended == "else") {
      RETURN_IF_ERROR(ExpectBlockEnd("else"));
      RETURN_IF_ERROR(ParseBody({"endif"}, &tag, &node->else_body, &ended));
    }
    body->push_back(std::move(node));
    return ExpectBlockEnd("endif");
  }

  absl::Status ParseFor(const Token& tag, Body* body) {
    NodePtr node = NewNode(Node::Kind::kFor, tag);
    while (true) {
      ASSIGN_OR_RETURN(std::string target, ExpectName("a loop variable"));
      node->targets.push_back(std::move(target));
      if (!IsOp(",")) break;
      Advance();
    }
    if (!IsName("in")) return Error(Cur(), Cat("expected 'in' in the for loop, got ", Describe(Cur())));
    Advance();
    ASSIGN_OR_RETURN(node->expr, ParseExpression(false));
    if (IsName("if")) {
      Advance();
      ASSIGN_OR_RETURN(node->filter, ParseExpression(true));
    }
    if (IsName("recursive")) return Error(Cur(), "unsupported: recursive for loops");
    RETURN_IF_ERROR(ExpectBlockEnd("for"));
    std::string ended;
    ++loop_depth_;
    absl::Status status = ParseBody({"else", "endfor"}, &tag, &node->body, &ended);
    --loop_depth_;
    RETURN_IF_ERROR(status);
    if (ended == "else") {
      RETURN_IF_ERROR(ExpectBlockEnd("else"));
      RETURN_IF_ERROR(ParseBody({"endfor"}, &tag, &node->else_body, &ended));
    }
    body->push_back(std::move(node));
    return ExpectBlockEnd("endfor");
  }

  absl::Status ParseSet(const Token& tag, Body* body) {
    NodePtr node = NewNode(Node::Kind::kSet, tag);
    ASSIGN_OR_RETURN(std::string target, ExpectName("a variable name after 'set'"));
    node->targets.push_back(std::move(target));
    if (IsOp(".")) {
      Advance();
      ASSIGN_OR_RETURN(node->attribute, ExpectName("an attribute name"));
    }
    while (node->attribute.empty() && IsOp(",")) {
      Advance();
      ASSIGN_OR_RETURN(std::string more, ExpectName("a variable name"));
      node->targets.push_back(std::move(more));
    }
    if (IsOp("=")) {
      Advance();
      ASSIGN_OR_RETURN(node->expr, ParseTuple());
      body->push_back(std::move(node));
      return ExpectBlockEnd("set");
    }
    if (Cur().type != Type::kBlockEnd || node->targets.size() != 1 || !node->attribute.empty()) {
      return Error(Cur(), Cat("expected '=' in the set tag, got ", Describe(Cur())));
    }
    Advance();
    node->kind = Node::Kind::kSetBlock;
    std::string ended;
    RETURN_IF_ERROR(ParseBody({"endset"}, &tag, &node->body, &ended));
    body->push_back(std::move(node));
    return ExpectBlockEnd("endset");
  }

  absl::Status ParseMacro(const Token& tag, Body* body) {
    NodePtr node = NewNode(Node::Kind::kMacro, tag);
    node->macro = std::make_unique<MacroNode>();
    node->macro->line = tag.line;
    ASSIGN_OR_RETURN(node->macro->name, ExpectName("a macro name"));
    RETURN_IF_ERROR(ExpectOp("(", "after the macro name"));
    while (!IsOp(")")) {
      ASSIGN_OR_RETURN(std::string param, ExpectName("a parameter name"));
      node->macro->params.push_back(std::move(param));
      ExprPtr default_value;
      if (IsOp("=")) {
        Advance();
        ASSIGN_OR_RETURN(default_value, ParseExpression(true));
      }
      node->macro->defaults.push_back(std::move(default_value));
      if (!IsOp(",")) break;
      Advance();
    }
    RETURN_IF_ERROR(ExpectOp(")", "to end the macro's parameters"));
    RETURN_IF_ERROR(ExpectBlockEnd("macro"));
    std::string ended;
    const int outer_loops = loop_depth_;
    loop_depth_ = 0;
    absl::Status status = ParseBody({"endmacro"}, &tag, &node->macro->body, &ended);
    loop_depth_ = outer_loops;
    RETURN_IF_ERROR(status);
    if (Cur().type == Type::kName && Cur().text == node->macro->name) Advance();
    body->push_back(std::move(node));
    return ExpectBlockEnd("endmacro");
  }

  // An expression, or several separated by commas (a tuple, made a list).
  absl::StatusOr<ExprPtr> ParseTuple() {
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

  absl::StatusOr<ExprPtr> ParseExpression(bool with_condexpr) {
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

  absl::StatusOr<ExprPtr> Binary(const Token& at, std::string op, ExprPtr left, ExprPtr right) {
    ExprPtr e = NewExpr(Expr::Kind::kBinary, at);
    e->name = std::move(op);
    e->children.push_back(std::move(left));
    e->children.push_back(std::move(right));
    return e;
  }

  absl::StatusOr<ExprPtr> ParseOr() {
    ASSIGN_OR_RETURN(ExprPtr e, ParseAnd());
    while (IsName("or")) {
      const Token& at = Cur();
      Advance();
      ASSIGN_OR_RETURN(ExprPtr right, ParseAnd());
      ASSIGN_OR_RETURN(e, Binary(at, "or", std::move(e), std::move(right)));
    }
    return e;
  }

  absl::StatusOr<ExprPtr> ParseAnd() {
    ASSIGN_OR_RETURN(ExprPtr e, ParseNot());
    while (IsName("and")) {
      const Token& at = Cur();
      Advance();
      ASSIGN_OR_RETURN(ExprPtr right, ParseNot());
      ASSIGN_OR_RETURN(e, Binary(at, "and", std::move(e), std::move(right)));
    }
    return e;
  }

  absl::StatusOr<ExprPtr> ParseNot() {
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

  absl::StatusOr<ExprPtr> ParseCompare() {
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
  absl::StatusOr<ExprPtr> ParseLeft(std::initializer_list<std::string_view> ops, Next next) {
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
  absl::StatusOr<ExprPtr> ParseMath1() { return ParseLeft({"+", "-"}, &Parser::ParseConcat); }
  absl::StatusOr<ExprPtr> ParseConcat() { return ParseLeft({"~"}, &Parser::ParseMath2); }
  absl::StatusOr<ExprPtr> ParseMath2() { return ParseLeft({"*", "/", "//", "%"}, &Parser::ParsePow); }
  absl::StatusOr<ExprPtr> ParsePow() { return ParseLeft({"**"}, &Parser::ParseUnaryWithFilters); }
  absl::StatusOr<ExprPtr> ParseUnaryWithFilters() { return ParseUnary(true); }

  absl::StatusOr<ExprPtr> ParseUnary(bool with_filter) {
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

  absl::StatusOr<ExprPtr> ParsePrimary() {
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

  absl::StatusOr<ExprPtr> ParseParenthesized() {
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

  absl::StatusOr<ExprPtr> ParseList() {
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

  absl::StatusOr<ExprPtr> ParseDict() {
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

  absl::StatusOr<ExprPtr> ParsePostfix(ExprPtr e) {
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
  absl::StatusOr<ExprPtr> ParseSubscript(const Token& at, ExprPtr object) {
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
  absl::StatusOr<ExprPtr> ParseCall(Expr::Kind kind, const Token& at, std::string name, ExprPtr subject) {
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

  absl::StatusOr<ExprPtr> ParseFilterExpr(ExprPtr e) {
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

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

absl::StatusOr<std::shared_ptr<const Program>> Parse(std::string_view source) {
  ASSIGN_OR_RETURN(std::vector<Token> tokens, Lex(source));
  return Parser(std::move(tokens)).Run();
}

}  // namespace lazykv::jinja
