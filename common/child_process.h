// Runs one of the project's server binaries as a child process on loopback (integration
// tests, benchmarks): waits for its "listening on HOST:PORT" line, signals it, reaps it.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace lazykv {

// Forks and execs `binary args...` with the inherited environment changed by `env`
// ("NAME=VALUE" sets, "NAME" unsets), its stderr appended to `log_path` (empty:
// inherited), and reads the first line it prints on stdout (up to 30 s). pid -1 when it
// could not be started.
struct SpawnedServer {
  pid_t pid = -1;
  std::string first_line;
};
SpawnedServer SpawnServer(const std::string& binary, std::vector<std::string> args, const std::string& log_path,
                          const std::vector<std::string>& env = {});
// The HOST:PORT after `label` ("listening on", "metrics on", "http on") in a server's
// first line, or "".
std::string AddressAfter(const std::string& line, const std::string& label);

// Not thread-safe, except that Stop may run on another thread than the one that
// started the process (one Stop at a time).
class ServerProcess {
 public:
  // Starts `binary args...` (SpawnServer); its stderr goes to `log_path` (empty: inherited).
  ServerProcess(const std::string& binary, std::vector<std::string> args, const std::string& log_path = "",
                const std::vector<std::string>& env = {});
  ~ServerProcess();  // SIGKILL if still running
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  bool started() const { return !address_.empty(); }
  const std::string& address() const { return address_; }                  // HOST:PORT of the service
  const std::string& metrics_address() const { return metrics_address_; }  // empty without metrics
  const std::string& http_address() const { return http_address_; }        // empty without an HTTP API
  const std::string& first_line() const { return first_line_; }
  pid_t pid() const { return pid_; }

  // Sends `signal` and waits for the exit; returns the exit code (128 + signal if killed).
  int Stop(int signal);
  // Sends `signal` (SIGSTOP and SIGCONT: a server that hangs, then resumes) without
  // waiting for an exit; after SIGSTOP or SIGCONT, returns once the process has stopped
  // or resumed (delivery is asynchronous). No effect once stopped by Stop.
  void Signal(int signal) const;

 private:
  pid_t pid_ = -1;
  std::string address_;
  std::string metrics_address_;
  std::string http_address_;
  std::string first_line_;
};

// The body of GET http://address/path (empty on failure).
std::string HttpGet(const std::string& address, const std::string& path);

}  // namespace lazykv
