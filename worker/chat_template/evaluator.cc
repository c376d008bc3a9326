#include "worker/chat_template/evaluator.h"

#include <algorithm>
#include <ctime>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "common/status_macros.h"
#include "worker/chat_template/builtins.h"
#include "worker/chat_template/operations.h"
#include "worker/chat_template/str_cat.h"

namespace lazykv::jinja {
namespace {

constexpr char kLinePayload[] = "lazykv.chat_template.line";
constexpr char kRaisedPayload[] = "lazykv.chat_template.raised";
constexpr const char* kGlobals[] = {"namespace", "raise_exception", "range", "dict", "strftime_now"};

struct Frame {
  absl::flat_hash_map<std::string, Value> vars;
  const Frame* parent = nullptr;

  const Value* Find(const std::string& name) const {
    for (const Frame* f = this; f != nullptr; f = f->parent) {
      if (auto it = f->vars.find(name); it != f->vars.end()) return &it->second;
    }
    return nullptr;
  }
};

enum class Flow { kNormal, kBreak, kContinue };

// The status with "chat template line N: " in front, unless it already names a line.
absl::Status At(int line, const absl::Status& status) {
  if (status.ok() || status.GetPayload(kLinePayload).has_value()) return status;
  absl::Status located(status.code(), Cat("chat template line ", line, ": ", status.message()));
  status.ForEachPayload([&](absl::string_view key, const absl::Cord& value) { located.SetPayload(key, value); });
  located.SetPayload(kLinePayload, absl::Cord(std::to_string(line)));
  return located;
}

class Renderer {
 public:
  Renderer(const Dict& variables, const RenderLimits& limits) : limits_(limits) {
    for (const char* name : kGlobals) root_.vars[name] = Value::MakeFunction(Function{name, nullptr});
    for (const auto& [name, value] : variables.entries) root_.vars[name] = value;
  }

  absl::StatusOr<std::string> Run(const Program& program) {
    std::string out;
    Flow flow = Flow::kNormal;
    RETURN_IF_ERROR(Exec(program.body, &root_, &out, &flow));
    return out;
  }

 private:
  absl::Status Append(std::string* out, std::string_view text) const {
    if (out->size() + text.size() > limits_.max_output_bytes) {
      return absl::ResourceExhaustedError(
          Cat("the rendered chat template exceeds ", limits_.max_output_bytes, " bytes"));
    }
    out->append(text);
    return absl::OkStatus();
  }

  absl::Status Exec(const Body& body, Frame* frame, std::string* out, Flow* flow) {
    for (const NodePtr& node : body) {
      RETURN_IF_ERROR(At(node->line, ExecNode(*node, frame, out, flow)));
      if (*flow != Flow::kNormal) return absl::OkStatus();
    }
    return absl::OkStatus();
  }

  absl::Status ExecNode(const Node& node, Frame* frame, std::string* out, Flow* flow) {
    switch (node.kind) {
      case Node::Kind::kText:
        return Append(out, node.text);
      case Node::Kind::kOutput: {
        ASSIGN_OR_RETURN(Value v, Eval(*node.expr, frame));
        return Append(out, ToStr(v));
      }
      case Node::Kind::kIf:
        for (const auto& [condition, branch] : node.branches) {
          ASSIGN_OR_RETURN(Value c, Eval(*condition, frame));
          if (Truthy(c)) return Exec(branch, frame, out, flow);
        }
        return Exec(node.else_body, frame, out, flow);
      case Node::Kind::kFor:
        return ExecFor(node, frame, out, flow);
      case Node::Kind::kSet: {
        ASSIGN_OR_RETURN(Value v, Eval(*node.expr, frame));
        return Assign(node, std::move(v), frame);
      }
      case Node::Kind::kSetBlock: {
        std::string captured;
        RETURN_IF_ERROR(Exec(node.body, frame, &captured, flow));
        return Assign(node, Value::String(std::move(captured)), frame);
      }
      case Node::Kind::kMacro:
        frame->vars[node.macro->name] = Value::MakeFunction(Function{node.macro->name, node.macro.get()});
        return absl::OkStatus();
      case Node::Kind::kBreak:
        *flow = Flow::kBreak;
        return absl::OkStatus();
      case Node::Kind::kContinue:
        *flow = Flow::kContinue;
        return absl::OkStatus();
      case Node::Kind::kScope:
        return Exec(node.body, frame, out, flow);
    }
    return absl::InternalError("unknown statement");
  }

  absl::Status Assign(const Node& node, Value v, Frame* frame) {
    if (!node.attribute.empty()) {
      const Value* target = frame->Find(node.targets[0]);
      if (target == nullptr || !target->is_namespace()) {
        return absl::InvalidArgumentError(
            Cat("cannot set attribute '", node.attribute, "' of '", node.targets[0], "': not a namespace()"));
      }
      target->mutable_namespace().Set(node.attribute, std::move(v));
      return absl::OkStatus();
    }
    return Bind(node.targets, std::move(v), frame);
  }

  static absl::Status Bind(const std::vector<std::string>& targets, Value v, Frame* frame) {
    if (targets.size() == 1) {
      frame->vars[targets[0]] = std::move(v);
      return absl::OkStatus();
    }
    ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
    if (items.size() != targets.size()) {
      return absl::InvalidArgumentError(Cat("cannot unpack ", items.size(), " values into ", targets.size(), " names"));
    }
    for (size_t i = 0; i < targets.size(); ++i) frame->vars[targets[i]] = std::move(items[i]);
    return absl::OkStatus();
  }

  absl::Status CountIteration() {
    if (++iterations_ > limits_.max_iterations) {
      return absl::ResourceExhaustedError(
          Cat("the chat template ran more than ", limits_.max_iterations, " loop iterations"));
    }
    return absl::OkStatus();
  }

  absl::Status ExecFor(const Node& node, Frame* frame, std::string* out, Flow* flow) {
    ASSIGN_OR_RETURN(Value iterable, Eval(*node.expr, frame));
    if (iterable.is_none() || iterable.is_number() || iterable.is_function() || iterable.is_namespace()) {
      return absl::InvalidArgumentError(Cat("'", TypeName(iterable), "' object is not iterable"));
    }
    ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(iterable));
    if (node.filter) {
      std::vector<Value> kept;
      for (Value& item : items) {
        RETURN_IF_ERROR(CountIteration());
        Frame scope{{}, frame};
        RETURN_IF_ERROR(Bind(node.targets, item, &scope));
        ASSIGN_OR_RETURN(Value keep, Eval(*node.filter, &scope));
        if (Truthy(keep)) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    if (items.empty()) return Exec(node.else_body, frame, out, flow);
    const auto n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      RETURN_IF_ERROR(CountIteration());
      Frame scope{{}, frame};
      RETURN_IF_ERROR(Bind(node.targets, items[i], &scope));
      Dict loop;
      loop.entries = {
          {"index", Value::Int(i + 1)},
          {"index0", Value::Int(i)},
          {"revindex", Value::Int(n - i)},
          {"revindex0", Value::Int(n - i - 1)},
          {"first", Value::Bool(i == 0)},
          {"last", Value::Bool(i == n - 1)},
          {"length", Value::Int(n)},
          {"previtem", i > 0 ? items[i - 1] : Value::Undefined("there is no previous item")},
          {"nextitem", i + 1 < n ? items[i + 1] : Value::Undefined("there is no next item")},
          {"depth", Value::Int(1)},
          {"depth0", Value::Int(0)},
      };
      scope.vars["loop"] = Value::MakeDict(std::move(loop));
      Flow inner = Flow::kNormal;
      RETURN_IF_ERROR(Exec(node.body, &scope, out, &inner));
      if (inner == Flow::kBreak) break;
    }
    return absl::OkStatus();
  }

  absl::StatusOr<CallArgs> EvalArgs(const Expr& e, Frame* frame) {
    CallArgs args;
    for (size_t i = 1; i < e.children.size(); ++i) {
      ASSIGN_OR_RETURN(Value v, Eval(*e.children[i], frame));
      args.positional.push_back(std::move(v));
    }
    for (const auto& [key, expr] : e.kwargs) {
      ASSIGN_OR_RETURN(Value v, Eval(*expr, frame));
      args.keyword.emplace_back(key, std::move(v));
    }
    return args;
  }

  absl::StatusOr<Value> Eval(const Expr& e, Frame* frame) {
    absl::StatusOr<Value> v = EvalExpr(e, frame);
    if (!v.ok()) return At(e.line, v.status());
    return v;
  }

  absl::StatusOr<Value> EvalExpr(const Expr& e, Frame* frame) {
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return e.literal;
      case Expr::Kind::kName: {
        const Value* v = frame->Find(e.name);
        return v != nullptr ? *v : Value::Undefined(Cat("'", e.name, "' is undefined"));
      }
      case Expr::Kind::kList: {
        std::vector<Value> items;
        for (const ExprPtr& child : e.children) {
          ASSIGN_OR_RETURN(Value v, Eval(*child, frame));
          items.push_back(std::move(v));
        }
        return Value::MakeList(std::move(items));
      }
      case Expr::Kind::kDict: {
        Dict dict;
        for (size_t i = 0; i + 1 < e.children.size(); i += 2) {
          ASSIGN_OR_RETURN(Value key, Eval(*e.children[i], frame));
          ASSIGN_OR_RETURN(Value v, Eval(*e.children[i + 1], frame));
          if (!key.is_string()) return absl::InvalidArgumentError("dict keys must be strings");
          dict.Set(key.str(), std::move(v));
        }
        return Value::MakeDict(std::move(dict));
      }
      case Expr::Kind::kGetAttr: {
        ASSIGN_OR_RETURN(Value object, Eval(*e.children[0], frame));
        return GetAttr(object, e.name);
      }
      case Expr::Kind::kGetItem: {
        ASSIGN_OR_RETURN(Value object, Eval(*e.children[0], frame));
        ASSIGN_OR_RETURN(Value key, Eval(*e.children[1], frame));
        return GetItem(object, key);
      }
      case Expr::Kind::kSlice: {
        ASSIGN_OR_RETURN(Value object, Eval(*e.children[0], frame));
        Value bounds[3] = {Value::None(), Value::None(), Value::None()};
        for (int i = 0; i < 3; ++i) {
          if (e.children[i + 1]) {
            ASSIGN_OR_RETURN(bounds[i], Eval(*e.children[i + 1], frame));
          }
        }
        return Slice(object, bounds[0], bounds[1], bounds[2]);
      }
      case Expr::Kind::kUnary: {
        ASSIGN_OR_RETURN(Value v, Eval(*e.children[0], frame));
        if (e.name == "not") return Value::Bool(!Truthy(v));
        if (e.name == "-") return Negate(v);
        RETURN_IF_ERROR(CheckDefined(v));
        if (!v.is_number()) return absl::InvalidArgumentError(Cat("bad operand type for unary +: '", TypeName(v), "'"));
        return v.is_bool() ? Value::Int(v.int_value()) : v;
      }
      case Expr::Kind::kBinary: {
        ASSIGN_OR_RETURN(Value a, Eval(*e.children[0], frame));
        if (e.name == "and" || e.name == "or") {
          if (Truthy(a) == (e.name == "or")) return a;
          return Eval(*e.children[1], frame);
        }
        ASSIGN_OR_RETURN(Value b, Eval(*e.children[1], frame));
        if (e.name == "~") return Concat(a, b, limits_);
        return Arithmetic(e.name, a, b, limits_);
      }
      case Expr::Kind::kCompare:
        return EvalCompare(e, frame);
      case Expr::Kind::kCond: {
        ASSIGN_OR_RETURN(Value c, Eval(*e.children[0], frame));
        if (Truthy(c)) return Eval(*e.children[1], frame);
        if (e.children[2]) return Eval(*e.children[2], frame);
        return Value::Undefined("the inline if-expression was false and has no else");
      }
      case Expr::Kind::kCall:
        return EvalCall(e, frame);
      case Expr::Kind::kFilter: {
        ASSIGN_OR_RETURN(Value input, Eval(*e.children[0], frame));
        ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, frame));
        return ApplyFilter(e.name, input, args, limits_);
      }
      case Expr::Kind::kTest: {
        ASSIGN_OR_RETURN(Value input, Eval(*e.children[0], frame));
        ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, frame));
        ASSIGN_OR_RETURN(bool result, ApplyTest(e.name, input, args));
        return Value::Bool(result != e.negated);
      }
    }
    return absl::InternalError("unknown expression");
  }

  absl::StatusOr<Value> EvalCompare(const Expr& e, Frame* frame) {
    ASSIGN_OR_RETURN(Value left, Eval(*e.children[0], frame));
    for (size_t i = 0; i < e.ops.size(); ++i) {
      ASSIGN_OR_RETURN(Value right, Eval(*e.children[i + 1], frame));
      const std::string& op = e.ops[i];
      bool result = false;
      if (op == "==" || op == "!=") {
        result = Equals(left, right) == (op == "==");
      } else if (op == "in" || op == "not in") {
        ASSIGN_OR_RETURN(bool contains, Contains(right, left));
        result = contains == (op == "in");
      } else {
        RETURN_IF_ERROR(CheckDefined(left));
        RETURN_IF_ERROR(CheckDefined(right));
        ASSIGN_OR_RETURN(int c, Compare(left, right));
        result = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
      }
      if (!result) return Value::Bool(false);
      left = std::move(right);
    }
    return Value::Bool(true);
  }

  absl::StatusOr<Value> EvalCall(const Expr& e, Frame* frame) {
    const Expr& callee = *e.children[0];
    if (callee.kind == Expr::Kind::kGetAttr) {  // a method call, unless the attribute holds a function
      ASSIGN_OR_RETURN(Value object, Eval(*callee.children[0], frame));
      const Value* member = (object.is_dict() || object.is_namespace()) ? object.dict().Find(callee.name) : nullptr;
      const bool dict_method = object.is_dict() && (callee.name == "items" || callee.name == "keys" ||
                                                    callee.name == "values" || callee.name == "get");
      if (member == nullptr || !member->is_function() || dict_method) {
        ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, frame));
        return CallMethod(object, callee.name, args, limits_);
      }
      ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, frame));
      return CallFunction(member->function(), args);
    }
    ASSIGN_OR_RETURN(Value f, Eval(callee, frame));
    if (!f.is_function()) {
      RETURN_IF_ERROR(CheckDefined(f));
      return absl::InvalidArgumentError(Cat("'", TypeName(f), "' object is not callable"));
    }
    ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, frame));
    return CallFunction(f.function(), args);
  }

  absl::StatusOr<Value> CallFunction(const Function& f, const CallArgs& args) {
    if (f.macro != nullptr) return CallMacro(*f.macro, args);
    if (f.name == "raise_exception") {
      const std::string message = args.positional.empty() ? "" : ToStr(args.positional[0]);
      absl::Status status = absl::InvalidArgumentError(Cat("raise_exception: ", message));
      status.SetPayload(kRaisedPayload, absl::Cord(message));
      return status;
    }
    if (f.name == "namespace" || f.name == "dict") {
      Dict attributes;
      for (const Value& positional : args.positional) {
        if (!positional.is_dict()) return absl::InvalidArgumentError(f.name + "() takes a dict or keyword arguments");
        for (const auto& [key, value] : positional.dict().entries) attributes.Set(key, value);
      }
      for (const auto& [key, value] : args.keyword) attributes.Set(key, value);
      return f.name == "dict" ? Value::MakeDict(std::move(attributes)) : Value::MakeNamespace(std::move(attributes));
    }
    if (f.name == "range") return Range(args);
    if (f.name == "strftime_now") {
      if (args.positional.size() != 1 || !args.positional[0].is_string()) {
        return absl::InvalidArgumentError("strftime_now() takes one format string");
      }
      const std::time_t now = std::time(nullptr);
      std::tm local{};
      localtime_r(&now, &local);
      char buf[256];
      const size_t n = std::strftime(buf, sizeof(buf), args.positional[0].str().c_str(), &local);
      return Value::String(std::string(buf, n));
    }
    return absl::InvalidArgumentError(Cat("unknown function '", f.name, "'"));
  }

  absl::StatusOr<Value> Range(const CallArgs& args) {
    std::vector<int64_t> bounds;
    for (const Value& v : args.positional) {
      if (!v.is_number() || v.is_float()) return absl::InvalidArgumentError("range() takes integers");
      bounds.push_back(v.int_value());
    }
    if (bounds.empty() || bounds.size() > 3 || !args.keyword.empty()) {
      return absl::InvalidArgumentError("range() takes 1 to 3 integers");
    }
    const int64_t start = bounds.size() == 1 ? 0 : bounds[0];
    const int64_t stop = bounds.size() == 1 ? bounds[0] : bounds[1];
    const int64_t step = bounds.size() == 3 ? bounds[2] : 1;
    if (step == 0) return absl::InvalidArgumentError("range() step must not be zero");
    std::vector<Value> items;
    for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
      if (static_cast<int64_t>(items.size()) >= limits_.max_iterations) {
        return absl::ResourceExhaustedError(Cat("range() longer than ", limits_.max_iterations, " items"));
      }
      items.push_back(Value::Int(i));
      if (__builtin_add_overflow(i, step, &i)) break;
    }
    return Value::MakeList(std::move(items));
  }

  absl::StatusOr<Value> CallMacro(const MacroNode& macro, const CallArgs& args) {
    if (call_depth_ >= limits_.max_call_depth) {
      return absl::ResourceExhaustedError(
          Cat("macro calls nested deeper than ", limits_.max_call_depth, " (in '", macro.name, "')"));
    }
    if (args.positional.size() > macro.params.size()) {
      return absl::InvalidArgumentError(
          Cat("macro '", macro.name, "' takes at most ", macro.params.size(), " arguments"));
    }
    Frame scope{{}, &root_};
    for (size_t i = 0; i < args.positional.size(); ++i) scope.vars[macro.params[i]] = args.positional[i];
    for (const auto& [key, value] : args.keyword) {
      if (std::find(macro.params.begin(), macro.params.end(), key) == macro.params.end()) {
        return absl::InvalidArgumentError(Cat("macro '", macro.name, "' has no parameter '", key, "'"));
      }
      scope.vars[key] = value;
    }
    for (size_t i = 0; i < macro.params.size(); ++i) {
      if (scope.vars.contains(macro.params[i])) continue;
      if (macro.defaults[i]) {
        ASSIGN_OR_RETURN(scope.vars[macro.params[i]], Eval(*macro.defaults[i], &scope));
      } else {
        scope.vars[macro.params[i]] =
            Value::Undefined(Cat("parameter '", macro.params[i], "' of macro '", macro.name, "' was not given"));
      }
    }
    ++call_depth_;
    std::string out;
    Flow flow = Flow::kNormal;
    absl::Status status = Exec(macro.body, &scope, &out, &flow);
    --call_depth_;
    RETURN_IF_ERROR(status);
    return Value::String(std::move(out));
  }

  const RenderLimits& limits_;
  Frame root_;
  int64_t iterations_ = 0;
  int call_depth_ = 0;
};

}  // namespace

absl::StatusOr<std::string> Render(const Program& program, const Dict& variables, const RenderLimits& limits) {
  return Renderer(variables, limits).Run(program);
}

std::optional<std::string> RaisedMessage(const absl::Status& status) {
  auto message = status.GetPayload(kRaisedPayload);
  if (!message) return std::nullopt;
  return std::string(*message);
}

}  // namespace lazykv::jinja
