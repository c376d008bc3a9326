// The values a chat template computes with, modelled on the Python objects Jinja2 hands
// templates: undefined, None, bool, int (64-bit here; overflow is an error), float, str,
// list (tuples too), dict (string keys, insertion order), namespace (the one mutable
// object: `{% set ns.x = 1 %}`), and functions (built-in globals, macros).
//
// A Value is cheap to copy: strings, lists and dicts are shared, immutable once built.
// A namespace is shared and mutable, so a Value holding one must stay on the thread of the
// render that made it; every other Value may be read from any number of threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace lazykv::jinja {

class Value;
struct MacroNode;  // ast.h

// A dict: string keys in insertion order (as Python dicts iterate).
struct Dict {
  std::vector<std::pair<std::string, Value>> entries;
  const Value* Find(std::string_view key) const;
  void Set(std::string key, Value value);  // replaces in place, else appends
};

// A callable global or macro, by name; the evaluator runs it.
struct Function {
  std::string name;
  const MacroNode* macro = nullptr;  // null: a built-in global named `name`
};

class Value {
 public:
  enum class Kind : uint8_t { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kNamespace, kFunction };

  // Undefined; `hint` says why, for the error when it is used ("'x' is undefined").
  Value() = default;
  static Value Undefined(std::string hint);
  static Value None();
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Float(double d);
  static Value String(std::string s);
  static Value MakeList(std::vector<Value> items);
  static Value MakeDict(Dict dict);
  static Value MakeNamespace(Dict attributes);
  static Value MakeFunction(Function f);
  static Value FromJson(const nlohmann::json& j);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  bool is_number() const { return kind_ == Kind::kBool || kind_ == Kind::kInt || kind_ == Kind::kFloat; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_namespace() const { return kind_ == Kind::kNamespace; }
  bool is_function() const { return kind_ == Kind::kFunction; }

  bool bool_value() const { return std::get<bool>(data_); }
  int64_t int_value() const { return kind_ == Kind::kBool ? std::get<bool>(data_) : std::get<int64_t>(data_); }
  // bool, int or float as a double.
  double number_value() const { return kind_ == Kind::kFloat ? std::get<double>(data_) : int_value(); }
  const std::string& str() const { return *std::get<std::shared_ptr<const std::string>>(data_); }
  const std::string& undefined_hint() const;
  const std::vector<Value>& list() const { return *std::get<std::shared_ptr<const std::vector<Value>>>(data_); }
  // A dict's or a namespace's entries.
  const Dict& dict() const { return *std::get<std::shared_ptr<Dict>>(data_); }
  Dict& mutable_namespace() const { return *std::get<std::shared_ptr<Dict>>(data_); }
  const Function& function() const { return *std::get<std::shared_ptr<const Function>>(data_); }

 private:
  Kind kind_ = Kind::kUndefined;
  std::variant<std::shared_ptr<const std::string>, bool, int64_t, double, std::shared_ptr<const std::vector<Value>>,
               std::shared_ptr<Dict>, std::shared_ptr<const Function>>
      data_;  // undefined: a null string (no hint) or the hint
};

// Python's type name ("str", "int", "dict", "NoneType", ...), for error messages.
std::string TypeName(const Value& v);

// Python truthiness: undefined, None, False, 0, 0.0, "", [] and {} are false.
bool Truthy(const Value& v);

// str(v) as Jinja2 prints it: undefined is "", None "None", True "True", floats as Python's
// repr, lists and dicts as Python's repr ("[1, 'a']", "{'k': None}").
std::string ToStr(const Value& v);
std::string Repr(const Value& v);

// ==, as Python (1 == 1.0 == True; lists and dicts by content; undefined equals only undefined).
bool Equals(const Value& a, const Value& b);

// <, <=, >, >= as Python: numbers with numbers, strings by code point, lists element-wise;
// other pairs are INVALID_ARGUMENT. Returns -1, 0 or 1.
absl::StatusOr<int> Compare(const Value& a, const Value& b);

// json.dumps(v, ensure_ascii, indent, separators, sort_keys) as transformers' `tojson`
// filter calls it. No indent: one line; an indent puts each item on its own line, indented
// by `indent` per level. Separators default to (", ", ": "), or (",", ": ") with an indent.
// Undefined, namespaces and functions are INVALID_ARGUMENT (not JSON serializable).
struct JsonFormat {
  bool ensure_ascii = false;
  std::optional<std::string> indent;
  std::optional<std::pair<std::string, std::string>> separators;  // (item, key)
  bool sort_keys = false;
};
absl::StatusOr<std::string> ToJson(const Value& v, const JsonFormat& format);

}  // namespace lazykv::jinja
