#include "worker/chat_template/builtins.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "common/status_macros.h"
#include "worker/chat_template/operations.h"
#include "worker/chat_template/py_string.h"
#include "worker/chat_template/str_cat.h"

namespace lazykv::jinja {
namespace {

constexpr std::string_view kFilters[] = {
    "abs",  "capitalize", "count",      "d",      "default", "first",  "float",  "indent",     "int",     "items",
    "join", "last",       "length",     "list",   "lower",   "map",    "reject", "rejectattr", "replace", "reverse",
    "safe", "select",     "selectattr", "string", "title",   "tojson", "trim",   "unique",     "upper"};
constexpr std::string_view kTests[] = {
    "boolean", "callable", "defined", "divisibleby", "eq",       "equalto",  "even",   "false", "float",
    "ge",      "gt",       "in",      "integer",     "iterable", "le",       "lower",  "lt",    "mapping",
    "ne",      "none",     "number",  "odd",         "sameas",   "sequence", "string", "true",  "undefined",
    "upper",   "==",       "!=",      "<",           "<=",       ">",        ">="};

// Arguments bound to parameter names in order: positional first, then keywords by name.
// Absent ones are nullopt.
absl::StatusOr<std::vector<std::optional<Value>>> Bind(std::string_view what, const CallArgs& args,
                                                       std::initializer_list<std::string_view> params) {
  std::vector<std::optional<Value>> bound(params.size());
  if (args.positional.size() > params.size()) {
    return absl::InvalidArgumentError(
        Cat(what, " takes at most ", params.size(), " arguments (", args.positional.size(), " given)"));
  }
  for (size_t i = 0; i < args.positional.size(); ++i) bound[i] = args.positional[i];
  for (const auto& [key, value] : args.keyword) {
    size_t i = 0;
    for (std::string_view p : params) {
      if (p == key) break;
      ++i;
    }
    if (i == params.size()) return absl::InvalidArgumentError(Cat(what, ": unexpected argument '", key, "'"));
    bound[i] = value;
  }
  return bound;
}

absl::StatusOr<std::string> StrArg(std::string_view what, const std::optional<Value>& v) {
  if (!v || !v->is_string()) return absl::InvalidArgumentError(Cat(what, " needs a string argument"));
  return v->str();
}

std::optional<std::string> OptionalStr(const std::optional<Value>& v) {
  if (!v || v->is_none() || v->is_undefined()) return std::nullopt;
  return ToStr(*v);
}

int64_t IntOr(const std::optional<Value>& v, int64_t fallback) {
  return v && v->is_number() && !v->is_float() ? v->int_value() : fallback;
}

absl::StatusOr<Value> Length(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return Value::Int(0);
    case Value::Kind::kString:
      return Value::Int(static_cast<int64_t>(CodePointCount(v.str())));
    case Value::Kind::kList:
      return Value::Int(static_cast<int64_t>(v.list().size()));
    case Value::Kind::kDict:
      return Value::Int(static_cast<int64_t>(v.dict().entries.size()));
    default:
      return absl::InvalidArgumentError(Cat("object of type '", TypeName(v), "' has no len()"));
  }
}

// Jinja2's make_attrgetter: a dotted path of items ("a.b", "0").
absl::StatusOr<Value> Attribute(const Value& item, std::string_view path) {
  Value v = item;
  while (true) {
    const size_t dot = path.find('.');
    const std::string part(path.substr(0, dot));
    Value key = Value::String(part);
    if (!part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      key = Value::Int(std::strtoll(part.c_str(), nullptr, 10));
    }
    ASSIGN_OR_RETURN(v, GetItem(v, key));
    if (dot == std::string_view::npos) return v;
    path.remove_prefix(dot + 1);
  }
}

// Python's str.splitlines().
std::vector<std::string> SplitLines(std::string_view s) {
  std::vector<std::string> lines;
  size_t start = 0, pos = 0, length = 0;
  while (pos < s.size()) {
    const char32_t c = DecodeAt(s, pos, &length);
    if (c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || (c >= 0x1C && c <= 0x1E) || c == 0x85 || c == 0x2028 ||
        c == 0x2029) {
      lines.emplace_back(s.substr(start, pos - start));
      pos += length;
      if (c == '\r' && pos < s.size() && s[pos] == '\n') ++pos;
      start = pos;
    } else {
      pos += length;
    }
  }
  if (start < s.size()) lines.emplace_back(s.substr(start));
  return lines;
}

absl::StatusOr<Value> Indent(const Value& input, const std::vector<std::optional<Value>>& a) {
  const std::string indention = a[0] && a[0]->is_string() ? a[0]->str() : std::string(IntOr(a[0], 4), ' ');
  const bool first = a[1] && Truthy(*a[1]), blank = a[2] && Truthy(*a[2]);
  std::vector<std::string> lines = SplitLines(ToStr(input) + "\n");
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) out += "\n";
    if (i > 0 && (blank || !lines[i].empty())) out += indention;
    out += lines[i];
  }
  if (first) out = indention + out;
  return Value::String(std::move(out));
}

absl::StatusOr<Value> ToInt(const Value& v, const std::optional<Value>& fallback) {
  const Value otherwise = fallback ? *fallback : Value::Int(0);
  if (v.is_float()) {
    const double d = v.number_value();
    if (!std::isfinite(d) || std::fabs(d) >= 9.2e18) return otherwise;
    return Value::Int(static_cast<int64_t>(d));
  }
  if (v.is_number()) return Value::Int(v.int_value());
  if (!v.is_string()) return otherwise;
  const std::string s = PyStrip(v.str(), std::nullopt, true, true);
  if (s.empty()) return otherwise;
  errno = 0;
  char* end = nullptr;
  const long long i = std::strtoll(s.c_str(), &end, 10);
  if (errno == 0 && *end == '\0') return Value::Int(i);
  const double d = std::strtod(s.c_str(), &end);
  if (*end != '\0' || !std::isfinite(d) || std::fabs(d) >= 9.2e18) return otherwise;
  return Value::Int(static_cast<int64_t>(d));
}

absl::StatusOr<Value> ToFloat(const Value& v, const std::optional<Value>& fallback) {
  const Value otherwise = fallback ? *fallback : Value::Float(0.0);
  if (v.is_number()) return Value::Float(v.number_value());
  if (!v.is_string()) return otherwise;
  const std::string s = PyStrip(v.str(), std::nullopt, true, true);
  char* end = nullptr;
  const double d = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0') return otherwise;
  return Value::Float(d);
}

absl::StatusOr<Value> ToJsonFilter(const Value& input, const std::vector<std::optional<Value>>& a) {
  JsonFormat format;
  format.ensure_ascii = a[0] && Truthy(*a[0]);
  if (a[1] && a[1]->is_string()) {
    format.indent = a[1]->str();
  } else if (a[1] && a[1]->is_number()) {
    format.indent = std::string(std::max<int64_t>(0, std::min<int64_t>(a[1]->int_value(), 64)), ' ');
  }
  if (a[2] && a[2]->is_list()) {
    const auto& s = a[2]->list();
    if (s.size() != 2 || !s[0].is_string() || !s[1].is_string()) {
      return absl::InvalidArgumentError("tojson: separators must be two strings");
    }
    format.separators = std::make_pair(s[0].str(), s[1].str());
  }
  format.sort_keys = a[3] && Truthy(*a[3]);
  ASSIGN_OR_RETURN(std::string json, ToJson(input, format));
  return Value::String(std::move(json));
}

// select / reject / selectattr / rejectattr.
absl::StatusOr<Value> Select(std::string_view name, const Value& input, const CallArgs& args) {
  const bool by_attribute = name.ends_with("attr");
  const bool keep = name.starts_with("select");
  size_t next = 0;
  std::string attribute;
  if (by_attribute) {
    if (args.positional.empty() || !args.positional[0].is_string()) {
      return absl::InvalidArgumentError(Cat(name, " needs an attribute name"));
    }
    attribute = args.positional[next++].str();
  }
  std::string test;
  if (next < args.positional.size()) {
    if (!args.positional[next].is_string() || !IsKnownTest(args.positional[next].str())) {
      return absl::InvalidArgumentError(Cat(name, ": unknown test ", Repr(args.positional[next])));
    }
    test = args.positional[next++].str();
  }
  CallArgs test_args;
  test_args.positional.assign(args.positional.begin() + next, args.positional.end());
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(input));
  std::vector<Value> out;
  for (const Value& item : items) {
    Value subject = item;
    if (by_attribute) {
      ASSIGN_OR_RETURN(subject, Attribute(item, attribute));
    }
    bool pass = false;
    if (test.empty()) {
      pass = Truthy(subject);
    } else {
      ASSIGN_OR_RETURN(pass, ApplyTest(test, subject, test_args));
    }
    if (pass == keep) out.push_back(item);
  }
  return Value::MakeList(std::move(out));
}

absl::StatusOr<Value> Map(const Value& input, const CallArgs& args, const RenderLimits& limits) {
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(input));
  std::vector<Value> out;
  std::optional<Value> attribute, fallback;
  for (const auto& [key, value] : args.keyword) {
    if (key == "attribute") attribute = value;
    if (key == "default") fallback = value;
  }
  if (attribute) {
    for (const Value& item : items) {
      ASSIGN_OR_RETURN(Value v, Attribute(item, ToStr(*attribute)));
      out.push_back(v.is_undefined() && fallback ? *fallback : v);
    }
    return Value::MakeList(std::move(out));
  }
  if (args.positional.empty() || !args.positional[0].is_string() || !IsKnownFilter(args.positional[0].str()) ||
      args.positional[0].str() == "map") {
    return absl::InvalidArgumentError("map needs attribute= or the name of a known filter");
  }
  CallArgs filter_args;
  filter_args.positional.assign(args.positional.begin() + 1, args.positional.end());
  filter_args.keyword = args.keyword;
  for (const Value& item : items) {
    ASSIGN_OR_RETURN(Value v, ApplyFilter(args.positional[0].str(), item, filter_args, limits));
    out.push_back(std::move(v));
  }
  return Value::MakeList(std::move(out));
}

absl::StatusOr<Value> Join(const Value& input, const std::vector<std::optional<Value>>& a, const RenderLimits& limits) {
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(input));
  const std::string separator = a[0] ? ToStr(*a[0]) : "";
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    Value item = items[i];
    if (a[1] && !a[1]->is_none()) {
      ASSIGN_OR_RETURN(item, Attribute(item, ToStr(*a[1])));
    }
    if (i) out += separator;
    out += ToStr(item);
    if (out.size() > limits.max_output_bytes) return absl::ResourceExhaustedError("join: string beyond the limit");
  }
  return Value::String(std::move(out));
}

}  // namespace

bool IsKnownFilter(std::string_view name) {
  return std::find(std::begin(kFilters), std::end(kFilters), name) != std::end(kFilters);
}

bool IsKnownTest(std::string_view name) {
  return std::find(std::begin(kTests), std::end(kTests), name) != std::end(kTests);
}

absl::StatusOr<Value> ApplyFilter(std::string_view name, const Value& input, const CallArgs& args,
                                  const RenderLimits& limits) {
  const std::string what = Cat("filter '", name, "'");
  if (name == "default" || name == "d") {
    ASSIGN_OR_RETURN(auto a, Bind(what, args, {"default_value", "boolean"}));
    const bool use_default = input.is_undefined() || (a[1] && Truthy(*a[1]) && !Truthy(input));
    return use_default ? (a[0] ? *a[0] : Value::String("")) : input;
  }
  if (name == "length" || name == "count") return Length(input);
  if (name == "tojson") {
    ASSIGN_OR_RETURN(auto a, Bind(what, args, {"ensure_ascii", "indent", "separators", "sort_keys"}));
    return ToJsonFilter(input, a);
  }
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
    return Select(name, input, args);
  }
  if (name == "map") return Map(input, args, limits);
  if (name == "safe") return input;
  if (name == "string") return Value::String(ToStr(input));
  if (name == "join") {
    ASSIGN_OR_RETURN(auto a, Bind(what, args, {"d", "attribute"}));
    return Join(input, a, limits);
  }
  if (name == "int" || name == "float") {
    ASSIGN_OR_RETURN(auto a, Bind(what, args, {"default"}));
    return name == "int" ? ToInt(input, a[0]) : ToFloat(input, a[0]);
  }
  if (name == "abs") {
    if (input.is_float()) return Value::Float(std::fabs(input.number_value()));
    if (input.is_number() && input.int_value() != INT64_MIN) return Value::Int(std::llabs(input.int_value()));
    return absl::InvalidArgumentError(Cat("bad operand type for abs(): '", TypeName(input), "'"));
  }
  if (name == "first" || name == "last") {
    ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(input));
    if (items.empty()) return Value::Undefined(Cat("'", name, "' of an empty sequence"));
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") {
    ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(input));
    return Value::MakeList(std::move(items));
  }
  if (name == "reverse") {
    if (input.is_string()) {
      const std::vector<size_t> offsets = CodePointOffsets(input.str());
      std::string out;
      for (size_t i = offsets.size() - 1; i > 0; --i) {
        out.append(input.str(), offsets[i - 1], offsets[i] - offsets[i - 1]);
      }
      return Value::String(std::move(out));
    }
    ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(input));
    std::reverse(items.begin(), items.end());
    return Value::MakeList(std::move(items));
  }
  if (name == "items") {
    if (input.is_undefined()) return Value::MakeList({});
    if (!input.is_dict()) return absl::InvalidArgumentError("filter 'items' needs a dict");
    std::vector<Value> pairs;
    for (const auto& [key, value] : input.dict().entries) pairs.push_back(Value::MakeList({Value::String(key), value}));
    return Value::MakeList(std::move(pairs));
  }
  if (name == "unique") {
    ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(input));
    std::vector<Value> out, seen;
    for (const Value& item : items) {
      const Value key = item.is_string() ? Value::String(AsciiLower(item.str())) : item;
      if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return Equals(s, key); })) {
        seen.push_back(key);
        out.push_back(item);
      }
    }
    return Value::MakeList(std::move(out));
  }
  if (name == "indent") {
    ASSIGN_OR_RETURN(auto a, Bind(what, args, {"width", "first", "blank"}));
    return Indent(input, a);
  }
  if (name == "replace") {
    ASSIGN_OR_RETURN(auto a, Bind(what, args, {"old", "new", "count"}));
    ASSIGN_OR_RETURN(std::string old_text, StrArg(what, a[0]));
    ASSIGN_OR_RETURN(std::string new_text, StrArg(what, a[1]));
    std::string out = PyReplace(ToStr(input), old_text, new_text, IntOr(a[2], -1));
    if (out.size() > limits.max_output_bytes) return absl::ResourceExhaustedError("replace: string beyond the limit");
    return Value::String(std::move(out));
  }
  if (name == "trim") {
    ASSIGN_OR_RETURN(auto a, Bind(what, args, {"chars"}));
    return Value::String(PyStrip(ToStr(input), OptionalStr(a[0]), true, true));
  }
  if (name == "upper") return Value::String(AsciiUpper(ToStr(input)));
  if (name == "lower") return Value::String(AsciiLower(ToStr(input)));
  if (name == "title") return Value::String(PyTitle(ToStr(input)));
  if (name == "capitalize") return Value::String(PyCapitalize(ToStr(input)));
  return absl::InvalidArgumentError(Cat("unknown filter '", name, "'"));
}

absl::StatusOr<bool> ApplyTest(std::string_view name, const Value& input, const CallArgs& args) {
  const Value* arg = args.positional.empty() ? nullptr : &args.positional[0];
  if (arg == nullptr && !args.keyword.empty()) arg = &args.keyword[0].second;
  auto need_arg = [&]() -> absl::Status {
    if (arg == nullptr) return absl::InvalidArgumentError(Cat("test '", name, "' needs an argument"));
    return absl::OkStatus();
  };
  if (name == "defined") return !input.is_undefined();
  if (name == "undefined") return input.is_undefined();
  if (name == "none") return input.is_none();
  if (name == "boolean") return input.is_bool();
  if (name == "true") return input.is_bool() && input.bool_value();
  if (name == "false") return input.is_bool() && !input.bool_value();
  if (name == "integer") return input.is_int();
  if (name == "float") return input.is_float();
  if (name == "number") return input.is_number();
  if (name == "string") return input.is_string();
  if (name == "mapping") return input.is_dict();
  if (name == "callable") return input.is_function();
  if (name == "iterable") return input.is_list() || input.is_dict() || input.is_string() || input.is_undefined();
  if (name == "sequence") return input.is_list() || input.is_dict() || input.is_string() || input.is_undefined();
  if (name == "lower" || name == "upper") {
    if (!input.is_string()) return false;
    bool cased = false;
    for (char c : input.str()) {
      const bool upper = c >= 'A' && c <= 'Z', lower = c >= 'a' && c <= 'z';
      if ((name == "lower" && upper) || (name == "upper" && lower)) return false;
      cased = cased || upper || lower;
    }
    return cased;
  }
  if (name == "even" || name == "odd" || name == "divisibleby") {
    if (!input.is_number() || input.is_float()) {
      return absl::InvalidArgumentError(Cat("test '", name, "' needs an integer"));
    }
    int64_t divisor = 2;
    if (name == "divisibleby") {
      RETURN_IF_ERROR(need_arg());
      if (!arg->is_number() || arg->is_float() || arg->int_value() == 0) {
        return absl::InvalidArgumentError("test 'divisibleby' needs a non-zero integer");
      }
      divisor = arg->int_value();
    }
    const bool divisible = divisor == -1 || input.int_value() % divisor == 0;
    return name == "odd" ? !divisible : divisible;
  }
  RETURN_IF_ERROR(need_arg());
  if (name == "eq" || name == "equalto" || name == "==") return Equals(input, *arg);
  if (name == "ne" || name == "!=") return !Equals(input, *arg);
  if (name == "sameas") {
    return input.kind() == arg->kind() && (input.is_none() || input.is_undefined() || Equals(input, *arg));
  }
  if (name == "in") return Contains(*arg, input);
  ASSIGN_OR_RETURN(const int c, Compare(input, *arg));
  if (name == "lt" || name == "<") return c < 0;
  if (name == "le" || name == "<=") return c <= 0;
  if (name == "gt" || name == ">") return c > 0;
  if (name == "ge" || name == ">=") return c >= 0;
  return absl::InvalidArgumentError(Cat("unknown test '", name, "'"));
}

absl::StatusOr<Value> CallMethod(const Value& object, std::string_view name, const CallArgs& args,
                                 const RenderLimits& limits) {
  const std::string what = Cat(TypeName(object), ".", name, "()");
  if (object.is_string()) {
    const std::string& s = object.str();
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      ASSIGN_OR_RETURN(auto a, Bind(what, args, {"chars"}));
      return Value::String(PyStrip(s, OptionalStr(a[0]), name != "rstrip", name != "lstrip"));
    }
    if (name == "split" || name == "rsplit") {
      ASSIGN_OR_RETURN(auto a, Bind(what, args, {"sep", "maxsplit"}));
      const int64_t maxsplit = IntOr(a[1], -1);
      if (a[0] && a[0]->is_string() && a[0]->str().empty()) return absl::InvalidArgumentError("empty separator");
      if (name == "rsplit" && maxsplit >= 0) {
        return absl::InvalidArgumentError("unsupported: str.rsplit with maxsplit");
      }
      std::vector<Value> parts;
      for (std::string& part : PySplit(s, OptionalStr(a[0]), maxsplit)) parts.push_back(Value::String(std::move(part)));
      return Value::MakeList(std::move(parts));
    }
    if (name == "startswith" || name == "endswith") {
      ASSIGN_OR_RETURN(auto a, Bind(what, args, {"prefix"}));
      std::vector<Value> candidates;
      if (a[0] && a[0]->is_list()) {
        candidates = a[0]->list();
      } else if (a[0]) {
        candidates.push_back(*a[0]);
      }
      if (candidates.empty() && !a[0]) return absl::InvalidArgumentError(what + " needs an argument");
      for (const Value& c : candidates) {
        if (!c.is_string()) return absl::InvalidArgumentError(what + " needs string arguments");
        if (name == "startswith" ? s.starts_with(c.str()) : s.ends_with(c.str())) return Value::Bool(true);
      }
      return Value::Bool(false);
    }
    if (name == "upper") return Value::String(AsciiUpper(s));
    if (name == "lower") return Value::String(AsciiLower(s));
    if (name == "title") return Value::String(PyTitle(s));
    if (name == "capitalize") return Value::String(PyCapitalize(s));
    if (name == "replace") {
      ASSIGN_OR_RETURN(auto a, Bind(what, args, {"old", "new", "count"}));
      ASSIGN_OR_RETURN(std::string old_text, StrArg(what, a[0]));
      ASSIGN_OR_RETURN(std::string new_text, StrArg(what, a[1]));
      std::string out = PyReplace(s, old_text, new_text, IntOr(a[2], -1));
      if (out.size() > limits.max_output_bytes) return absl::ResourceExhaustedError("replace: string beyond the limit");
      return Value::String(std::move(out));
    }
    if (name == "find" || name == "count") {
      ASSIGN_OR_RETURN(auto a, Bind(what, args, {"sub"}));
      ASSIGN_OR_RETURN(std::string sub, StrArg(what, a[0]));
      if (name == "find") {
        const size_t at = s.find(sub);
        return Value::Int(at == std::string::npos ? -1 : static_cast<int64_t>(CodePointCount(s.substr(0, at))));
      }
      if (sub.empty()) return Value::Int(static_cast<int64_t>(CodePointCount(s)) + 1);
      int64_t n = 0;
      for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) ++n;
      return Value::Int(n);
    }
    if (name == "join") {
      ASSIGN_OR_RETURN(auto a, Bind(what, args, {"iterable"}));
      if (!a[0]) return absl::InvalidArgumentError(what + " needs an argument");
      ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(*a[0]));
      std::string out;
      for (size_t i = 0; i < items.size(); ++i) {
        if (!items[i].is_string()) return absl::InvalidArgumentError(what + ": items must be strings");
        if (i) out += s;
        out += items[i].str();
        if (out.size() > limits.max_output_bytes) return absl::ResourceExhaustedError("join: string beyond the limit");
      }
      return Value::String(std::move(out));
    }
  }
  if (object.is_dict()) {
    const Dict& d = object.dict();
    if (name == "items" || name == "keys" || name == "values") {
      if (!args.positional.empty() || !args.keyword.empty())
        return absl::InvalidArgumentError(what + " takes no arguments");
      std::vector<Value> out;
      for (const auto& [key, value] : d.entries) {
        if (name == "items") out.push_back(Value::MakeList({Value::String(key), value}));
        if (name == "keys") out.push_back(Value::String(key));
        if (name == "values") out.push_back(value);
      }
      return Value::MakeList(std::move(out));
    }
    if (name == "get") {
      ASSIGN_OR_RETURN(auto a, Bind(what, args, {"key", "default"}));
      if (!a[0]) return absl::InvalidArgumentError(what + " needs a key");
      const Value* v = a[0]->is_string() ? d.Find(a[0]->str()) : nullptr;
      if (v != nullptr) return *v;
      return a[1] ? *a[1] : Value::None();
    }
  }
  RETURN_IF_ERROR(CheckDefined(object));
  return absl::InvalidArgumentError(Cat("'", TypeName(object), " object' has no method '", name, "'"));
}

}  // namespace lazykv::jinja
