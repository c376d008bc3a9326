// Parse() (parser.h) and Parser's statement half (the Parser class is in
// parser_internal.h; its expression half in expression_parser.cc): the template body of
// text, {{ }} outputs and {% %} tags, and the if, for, set, macro, break, continue and
// generation tags.
#include "worker/chat_template/parser.h"

#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/status_macros.h"
#include "worker/chat_template/lexer.h"
#include "worker/chat_template/parser_internal.h"
#include "worker/chat_template/str_cat.h"

namespace lazykv::jinja {
namespace parser_internal {
namespace {

// The end tags a body was waiting for, for an error message.
std::string JoinNames(std::initializer_list<std::string_view> names) {
  std::string out;
  for (std::string_view name : names) out += Cat(out.empty() ? "" : " or ", "'{% ", name, " %}'");
  return out;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const Program>> Parser::Run() {
  auto program = std::make_shared<Program>();
  std::string ended_by;
  RETURN_IF_ERROR(ParseBody({}, nullptr, &program->body, &ended_by));
  return program;
}

// Nodes until `{% <one of end_names>` (then pos_ is past that name and *ended_by says
// which) or, when end_names is empty, the end of the template.
absl::Status Parser::ParseBody(std::initializer_list<std::string_view> end_names, const Token* opener, Body* body,
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
absl::Status Parser::ParseStatement(std::initializer_list<std::string_view> end_names, const Token* opener,
                                    Body* body) {
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

absl::Status Parser::ParseIf(const Token& tag, Body* body) {
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

absl::Status Parser::ParseFor(const Token& tag, Body* body) {
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

absl::Status Parser::ParseSet(const Token& tag, Body* body) {
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

absl::Status Parser::ParseMacro(const Token& tag, Body* body) {
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

}  // namespace parser_internal

absl::StatusOr<std::shared_ptr<const Program>> Parse(std::string_view source) {
  ASSIGN_OR_RETURN(std::vector<Token> tokens, Lex(source));
  return parser_internal::Parser(std::move(tokens)).Run();
}

}  // namespace lazykv::jinja
