#include "worker/chat_template/operations.h"

#include <cmath>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "common/status_macros.h"
#include "worker/chat_template/py_string.h"
#include "worker/chat_template/str_cat.h"

namespace lazykv::jinja {
namespace {

absl::Status TypeError(std::string_view op, const Value& a, const Value& b) {
  return absl::InvalidArgumentError(
      Cat("unsupported operand types for ", op, ": '", TypeName(a), "' and '", TypeName(b), "'"));
}

absl::Status TooLarge(std::string_view what, const RenderLimits& limits) {
  return absl::ResourceExhaustedError(
      Cat(what, " beyond the render limit (", limits.max_output_bytes, " bytes, ", limits.max_iterations, " items)"));
}

absl::StatusOr<Value> Repeat(const Value& seq, int64_t times, const RenderLimits& limits) {
  if (times <= 0) return seq.is_string() ? Value::String("") : Value::MakeList({});
  if (seq.is_string()) {
    if (seq.str().size() * static_cast<unsigned __int128>(times) > limits.max_output_bytes) {
      return TooLarge("a repeated string", limits);
    }
    std::string out;
    for (int64_t i = 0; i < times; ++i) out += seq.str();
    return Value::String(std::move(out));
  }
  if (seq.list().size() * static_cast<unsigned __int128>(times) > static_cast<uint64_t>(limits.max_iterations)) {
    return TooLarge("a repeated list", limits);
  }
  std::vector<Value> out;
  for (int64_t i = 0; i < times; ++i) out.insert(out.end(), seq.list().begin(), seq.list().end());
  return Value::MakeList(std::move(out));
}

int64_t FloorDiv(int64_t a, int64_t b) {
  const int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

}  // namespace

absl::Status CheckDefined(const Value& v) {
  if (!v.is_undefined()) return absl::OkStatus();
  return absl::InvalidArgumentError(v.undefined_hint().empty() ? "use of an undefined value" : v.undefined_hint());
}

absl::StatusOr<Value> Arithmetic(std::string_view op, const Value& a, const Value& b, const RenderLimits& limits) {
  RETURN_IF_ERROR(CheckDefined(a));
  RETURN_IF_ERROR(CheckDefined(b));
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      if (a.str().size() + b.str().size() > limits.max_output_bytes) return TooLarge("a string", limits);
      return Value::String(a.str() + b.str());
    }
    if (a.is_list() && b.is_list()) {
      if (a.list().size() + b.list().size() > static_cast<uint64_t>(limits.max_iterations)) {
        return TooLarge("a list", limits);
      }
      std::vector<Value> out = a.list();
      out.insert(out.end(), b.list().begin(), b.list().end());
      return Value::MakeList(std::move(out));
    }
  }
  if (op == "*") {
    if ((a.is_string() || a.is_list()) && b.is_number() && !b.is_float()) return Repeat(a, b.int_value(), limits);
    if ((b.is_string() || b.is_list()) && a.is_number() && !a.is_float()) return Repeat(b, a.int_value(), limits);
  }
  if (op == "%" && a.is_string()) {
    return absl::InvalidArgumentError("unsupported: printf-style string formatting ('...' % x)");
  }
  if (!a.is_number() || !b.is_number()) return TypeError(op, a, b);
  if (op == "/") {
    if (b.number_value() == 0) return absl::InvalidArgumentError("division by zero");
    return Value::Float(a.number_value() / b.number_value());
  }
  if (a.is_float() || b.is_float() || (op == "**" && b.int_value() < 0)) {
    const double x = a.number_value(), y = b.number_value();
    if ((op == "//" || op == "%") && y == 0) return absl::InvalidArgumentError("division by zero");
    if (op == "+") return Value::Float(x + y);
    if (op == "-") return Value::Float(x - y);
    if (op == "*") return Value::Float(x * y);
    if (op == "//") return Value::Float(std::floor(x / y));
    if (op == "%") {
      double m = std::fmod(x, y);
      if (m != 0 && ((m < 0) != (y < 0))) m += y;
      return Value::Float(m);
    }
    if (op == "**") {
      if (x == 0 && y < 0) return absl::InvalidArgumentError("0.0 cannot be raised to a negative power");
      return Value::Float(std::pow(x, y));
    }
  }
  const int64_t x = a.int_value(), y = b.int_value();
  int64_t r = 0;
  bool overflow = false;
  if (op == "+") {
    overflow = __builtin_add_overflow(x, y, &r);
  } else if (op == "-") {
    overflow = __builtin_sub_overflow(x, y, &r);
  } else if (op == "*") {
    overflow = __builtin_mul_overflow(x, y, &r);
  } else if (op == "//" || op == "%") {
    if (y == 0) return absl::InvalidArgumentError("integer division or modulo by zero");
    if (x == INT64_MIN && y == -1) {
      overflow = op == "//";
    } else {
      r = op == "//" ? FloorDiv(x, y) : x - FloorDiv(x, y) * y;
    }
  } else if (op == "**") {
    r = 1;
    for (int64_t i = 0; i < y && !overflow; ++i) {
      overflow = __builtin_mul_overflow(r, x, &r);
      if (r == 0 || r == 1) break;  // 0 and 1 stay put (and -1 alternates: handled below)
    }
    if (x == -1) r = (y % 2 == 0) ? 1 : -1;
  } else {
    return absl::InvalidArgumentError(Cat("unknown operator ", op));
  }
  if (overflow) return absl::InvalidArgumentError(Cat("integer overflow in ", x, " ", op, " ", y));
  return Value::Int(r);
}

absl::StatusOr<Value> Negate(const Value& v) {
  RETURN_IF_ERROR(CheckDefined(v));
  if (v.is_float()) return Value::Float(-v.number_value());
  if (v.is_number()) {
    if (v.int_value() == INT64_MIN) return absl::InvalidArgumentError("integer overflow in negation");
    return Value::Int(-v.int_value());
  }
  return absl::InvalidArgumentError(Cat("bad operand type for unary -: '", TypeName(v), "'"));
}

absl::StatusOr<Value> Concat(const Value& a, const Value& b, const RenderLimits& limits) {
  std::string out = ToStr(a);
  if (out.size() > limits.max_output_bytes) return TooLarge("a string", limits);
  out += ToStr(b);
  if (out.size() > limits.max_output_bytes) return TooLarge("a string", limits);
  return Value::String(std::move(out));
}

absl::StatusOr<bool> Contains(const Value& haystack, const Value& needle) {
  switch (haystack.kind()) {
    case Value::Kind::kUndefined:
      return false;
    case Value::Kind::kString:
      if (!needle.is_string()) {
        return absl::InvalidArgumentError(
            Cat("'in <string>' requires a string as the left operand, not '", TypeName(needle), "'"));
      }
      return haystack.str().find(needle.str()) != std::string::npos;
    case Value::Kind::kList:
      for (const Value& item : haystack.list()) {
        if (Equals(item, needle)) return true;
      }
      return false;
    case Value::Kind::kDict:
      return needle.is_string() && haystack.dict().Find(needle.str()) != nullptr;
    default:
      return absl::InvalidArgumentError(Cat("argument of type '", TypeName(haystack), "' is not iterable"));
  }
}

absl::StatusOr<Value> GetAttr(const Value& object, std::string_view name) {
  RETURN_IF_ERROR(CheckDefined(object));
  if (object.is_dict() || object.is_namespace()) {
    if (const Value* v = object.dict().Find(name)) return *v;
  }
  return Value::Undefined(Cat("'", TypeName(object), " object' has no attribute '", name, "'"));
}

absl::StatusOr<Value> GetItem(const Value& object, const Value& key) {
  RETURN_IF_ERROR(CheckDefined(object));
  const auto missing = [&] { return Value::Undefined(Cat("'", TypeName(object), " object' has no item ", Repr(key))); };
  if ((object.is_list() || object.is_string()) && key.is_number() && !key.is_float()) {
    int64_t i = key.int_value();
    if (object.is_list()) {
      const int64_t n = static_cast<int64_t>(object.list().size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return missing();
      return object.list()[i];
    }
    const std::vector<size_t> offsets = CodePointOffsets(object.str());
    const int64_t n = static_cast<int64_t>(offsets.size()) - 1;
    if (i < 0) i += n;
    if (i < 0 || i >= n) return missing();
    return Value::String(object.str().substr(offsets[i], offsets[i + 1] - offsets[i]));
  }
  if ((object.is_dict() || object.is_namespace()) && key.is_string()) {
    if (object.is_dict()) {
      if (const Value* v = object.dict().Find(key.str())) return *v;
    }
    return missing();
  }
  return missing();
}

absl::StatusOr<Value> Slice(const Value& object, const Value& start, const Value& stop, const Value& step) {
  RETURN_IF_ERROR(CheckDefined(object));
  for (const Value* bound : {&start, &stop, &step}) {
    if (!bound->is_none() && !bound->is_undefined() && !(bound->is_number() && !bound->is_float())) {
      return absl::InvalidArgumentError("slice indices must be integers or None");
    }
  }
  const int64_t s = step.is_number() ? step.int_value() : 1;
  if (s == 0) return absl::InvalidArgumentError("slice step cannot be zero");
  if (!object.is_list() && !object.is_string()) {
    return absl::InvalidArgumentError(Cat("'", TypeName(object), "' object is not subscriptable"));
  }
  std::vector<size_t> offsets;
  int64_t n = 0;
  if (object.is_list()) {
    n = static_cast<int64_t>(object.list().size());
  } else {
    offsets = CodePointOffsets(object.str());
    n = static_cast<int64_t>(offsets.size()) - 1;
  }
  // Python's PySlice_AdjustIndices.
  auto adjust = [&](const Value& bound, int64_t fallback) {
    if (!bound.is_number()) return fallback;
    int64_t i = bound.int_value();
    if (i < 0) {
      i += n;
      if (i < 0) i = s < 0 ? -1 : 0;
    } else if (i >= n) {
      i = s < 0 ? n - 1 : n;
    }
    return i;
  };
  const int64_t begin = adjust(start, s < 0 ? n - 1 : 0);
  const int64_t end = adjust(stop, s < 0 ? -1 : n);
  std::vector<Value> items;
  std::string text;
  for (int64_t i = begin; s > 0 ? i < end : i > end; i += s) {
    if (object.is_list()) {
      items.push_back(object.list()[i]);
    } else {
      text.append(object.str(), offsets[i], offsets[i + 1] - offsets[i]);
    }
  }
  return object.is_list() ? Value::MakeList(std::move(items)) : Value::String(std::move(text));
}

absl::StatusOr<std::vector<Value>> Iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return std::vector<Value>{};
    case Value::Kind::kList:
      return v.list();
    case Value::Kind::kDict: {
      std::vector<Value> keys;
      for (const auto& entry : v.dict().entries) keys.push_back(Value::String(entry.first));
      return keys;
    }
    case Value::Kind::kString: {
      std::vector<Value> chars;
      const std::vector<size_t> offsets = CodePointOffsets(v.str());
      for (size_t i = 0; i + 1 < offsets.size(); ++i) {
        chars.push_back(Value::String(v.str().substr(offsets[i], offsets[i + 1] - offsets[i])));
      }
      return chars;
    }
    default:
      return absl::InvalidArgumentError(Cat("'", TypeName(v), "' object is not iterable"));
  }
}

}  // namespace lazykv::jinja
