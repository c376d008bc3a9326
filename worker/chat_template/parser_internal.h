// The recursive-descent Parser behind Parse() (parser.h), shared by its two source files:
// parser.cc (statements: the template body and its {% %} tags) and expression_parser.cc
// (expressions: precedence climbing, primaries, postfix access, calls, filters, tests,
// literals). Private to them; everything else uses parser.h.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/chat_template/ast.h"
#include "worker/chat_template/lexer.h"
#include "worker/chat_template/parser.h"
#include "worker/chat_template/str_cat.h"

namespace lazykv::jinja::parser_internal {

using Type = Token::Type;

// How a token reads in an error message.
inline std::string Describe(const Token& t) {
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

  absl::StatusOr<std::shared_ptr<const Program>> Run();

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

  // Token cursor and error helpers, used by both halves.
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

  // An expression or a statement node of `kind`, placed where `at` is.
  template <typename T>
  static std::unique_ptr<T> NewAt(typename T::Kind kind, const Token& at) {
    auto made = std::make_unique<T>();
    made->kind = kind;
    made->offset = at.offset;
    made->line = at.line;
    return made;
  }
  ExprPtr NewExpr(Expr::Kind kind, const Token& at) { return NewAt<Expr>(kind, at); }
  NodePtr NewNode(Node::Kind kind, const Token& at) { return NewAt<Node>(kind, at); }

  // Statements (parser.cc).
  absl::Status ParseBody(std::initializer_list<std::string_view> end_names, const Token* opener, Body* body,
                         std::string* ended_by);
  absl::Status ParseStatement(std::initializer_list<std::string_view> end_names, const Token* opener, Body* body);
  absl::Status ParseIf(const Token& tag, Body* body);
  absl::Status ParseFor(const Token& tag, Body* body);
  absl::Status ParseSet(const Token& tag, Body* body);
  absl::Status ParseMacro(const Token& tag, Body* body);

  // Expressions (expression_parser.cc), loosest-binding first.
  absl::StatusOr<ExprPtr> ParseTuple();
  absl::StatusOr<ExprPtr> ParseExpression(bool with_condexpr);
  absl::StatusOr<ExprPtr> Binary(const Token& at, std::string op, ExprPtr left, ExprPtr right);
  absl::StatusOr<ExprPtr> ParseOr();
  absl::StatusOr<ExprPtr> ParseAnd();
  absl::StatusOr<ExprPtr> ParseNot();
  absl::StatusOr<ExprPtr> ParseCompare();
  template <typename Next>
  absl::StatusOr<ExprPtr> ParseLeft(std::initializer_list<std::string_view> ops, Next next);
  absl::StatusOr<ExprPtr> ParseMath1();
  absl::StatusOr<ExprPtr> ParseConcat();
  absl::StatusOr<ExprPtr> ParseMath2();
  absl::StatusOr<ExprPtr> ParsePow();
  absl::StatusOr<ExprPtr> ParseUnaryWithFilters();
  absl::StatusOr<ExprPtr> ParseUnary(bool with_filter);
  absl::StatusOr<ExprPtr> ParsePrimary();
  absl::StatusOr<ExprPtr> ParseParenthesized();
  absl::StatusOr<ExprPtr> ParseList();
  absl::StatusOr<ExprPtr> ParseDict();
  absl::StatusOr<ExprPtr> ParsePostfix(ExprPtr e);
  absl::StatusOr<ExprPtr> ParseSubscript(const Token& at, ExprPtr object);
  absl::StatusOr<ExprPtr> ParseCall(Expr::Kind kind, const Token& at, std::string name, ExprPtr subject);
  absl::StatusOr<ExprPtr> ParseFilterExpr(ExprPtr e);

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;  // enclosing for loops, so break/continue outside one is an error
};

}  // namespace lazykv::jinja::parser_internal
