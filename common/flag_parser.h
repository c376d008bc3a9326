// Command-line flags for the project's programs: `--name value` or `--name=value`,
// boolean switches, and typed values with errors that name the flag.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "absl/status/status.h"

namespace lazykv {

// Not thread-safe: used once, at startup.
class FlagParser {
 public:
  explicit FlagParser(std::string usage) : usage_(std::move(usage)) {}

  // A flag taking a value; the handler's error is reported with the flag's name.
  void Add(const std::string& name, std::function<absl::Status(const std::string&)> handler);
  void AddString(const std::string& name, std::string* out);
  void AddInt(const std::string& name, int* out);
  void AddUint64(const std::string& name, uint64_t* out);
  void AddUint64(const std::string& name, std::optional<uint64_t>* out);  // absent unless given
  void AddDouble(const std::string& name, double* out);
  void AddFloat(const std::string& name, float* out);
  void AddByteSize(const std::string& name, uint64_t* out);  // 8GiB, 512MiB, 4096
  void AddSwitch(const std::string& name, bool* out);        // no value

  // CANCELLED carrying the usage text for --help; INVALID_ARGUMENT for bad flags.
  absl::Status Parse(int argc, char** argv) const;
  const std::string& usage() const { return usage_; }

 private:
  std::string usage_;
  std::map<std::string, std::function<absl::Status(const std::string&)>> with_value_;
  std::map<std::string, bool*> switches_;
};

// A server's exit for a Parse() error: the usage on stdout and 0 for --help, else
// "program: message" on stderr and 2.
int ExitForFlagError(const absl::Status& status, const std::string& program);

}  // namespace lazykv
