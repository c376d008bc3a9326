#include "common/flag_parser.h"

#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "common/byte_size.h"

namespace lazykv {
namespace {

absl::Status NotANumber(const std::string& text) {
  return absl::InvalidArgumentError(absl::StrFormat("'%s' is not a valid number", text));
}

}  // namespace

void FlagParser::Add(const std::string& name, std::function<absl::Status(const std::string&)> handler) {
  with_value_[name] = std::move(handler);
}

void FlagParser::AddString(const std::string& name, std::string* out) {
  Add(name, [out](const std::string& v) {
    *out = v;
    return absl::OkStatus();
  });
}

void FlagParser::AddInt(const std::string& name, int* out) {
  Add(name, [out](const std::string& v) { return absl::SimpleAtoi(v, out) ? absl::OkStatus() : NotANumber(v); });
}

void FlagParser::AddUint64(const std::string& name, uint64_t* out) {
  Add(name, [out](const std::string& v) { return absl::SimpleAtoi(v, out) ? absl::OkStatus() : NotANumber(v); });
}

void FlagParser::AddUint64(const std::string& name, std::optional<uint64_t>* out) {
  Add(name, [out](const std::string& v) {
    uint64_t value = 0;
    if (!absl::SimpleAtoi(v, &value)) return NotANumber(v);
    *out = value;
    return absl::OkStatus();
  });
}

void FlagParser::AddDouble(const std::string& name, double* out) {
  Add(name, [out](const std::string& v) { return absl::SimpleAtod(v, out) ? absl::OkStatus() : NotANumber(v); });
}

void FlagParser::AddFloat(const std::string& name, float* out) {
  Add(name, [out](const std::string& v) { return absl::SimpleAtof(v, out) ? absl::OkStatus() : NotANumber(v); });
}

void FlagParser::AddByteSize(const std::string& name, uint64_t* out) {
  Add(name, [out](const std::string& v) -> absl::Status {
    auto bytes = ParseByteSize(v);
    if (!bytes.ok()) return bytes.status();
    *out = *bytes;
    return absl::OkStatus();
  });
}

void FlagParser::AddSwitch(const std::string& name, bool* out) { switches_[name] = out; }

absl::Status FlagParser::Parse(int argc, char** argv) const {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") return absl::CancelledError(usage_);
    if (auto sw = switches_.find(arg); sw != switches_.end()) {
      *sw->second = true;
      continue;
    }
    std::string value;
    bool has_value = false;
    if (const size_t eq = arg.find('='); arg.starts_with("--") && eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      has_value = true;
    }
    auto it = with_value_.find(arg);
    if (it == with_value_.end()) {
      return absl::InvalidArgumentError(absl::StrFormat("unknown flag %s\n%s", arg, usage_));
    }
    if (!has_value) {
      if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrFormat("%s needs a value", arg));
      value = argv[++i];
    }
    if (absl::Status s = it->second(value); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrFormat("%s: %s", arg, std::string(s.message())));
    }
  }
  return absl::OkStatus();
}

int ExitForFlagError(const absl::Status& status, const std::string& program) {
  if (absl::IsCancelled(status)) {
    std::cout << status.message();
    return 0;
  }
  std::cerr << program << ": " << status.message() << "\n";
  return 2;
}

}  // namespace lazykv
