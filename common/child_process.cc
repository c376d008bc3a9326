#include "common/child_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <regex>

namespace lazykv {

SpawnedServer SpawnServer(const std::string& binary, std::vector<std::string> args, const std::string& log_path,
                          const std::vector<std::string>& env) {
  SpawnedServer spawned;
  // The inherited environment, with `env` applied ("NAME=VALUE" sets, "NAME" unsets).
  std::vector<std::string> environment;
  auto name_of = [](std::string_view entry) { return entry.substr(0, entry.find('=')); };
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view entry(*e);
    bool replaced = false;
    for (const std::string& change : env) replaced = replaced || name_of(change) == name_of(entry);
    if (!replaced) environment.emplace_back(entry);
  }
  for (const std::string& change : env) {
    if (change.find('=') != std::string::npos) environment.push_back(change);
  }
  std::vector<char*> argv = {const_cast<char*>(binary.c_str())}, envp;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (std::string& e : environment) envp.push_back(e.data());
  envp.push_back(nullptr);
  int out[2];
  if (pipe(out) != 0) return spawned;
  spawned.pid = fork();
  if (spawned.pid == 0) {
    dup2(out[1], STDOUT_FILENO);
    close(out[0]);
    close(out[1]);
    if (!log_path.empty()) {
      const int log = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (log >= 0) dup2(log, STDERR_FILENO);
    }
    execve(binary.c_str(), argv.data(), envp.data());
    _exit(127);
  }
  close(out[1]);
  // Read the first line (up to 30 s: a cold start opens RocksDB).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  char c;
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{out[0], POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    if (read(out[0], &c, 1) != 1) break;
    if (c == '\n') break;
    spawned.first_line.push_back(c);
  }
  close(out[0]);  // later stdout writes are not read; the servers print only this line
  return spawned;
}

std::string AddressAfter(const std::string& line, const std::string& label) {
  std::smatch m;
  if (std::regex_search(line, m, std::regex(label + R"( (\S+:\d+))"))) return m[1];
  return "";
}

ServerProcess::ServerProcess(const std::string& binary, std::vector<std::string> args, const std::string& log_path,
                             const std::vector<std::string>& env) {
  SpawnedServer spawned = SpawnServer(binary, std::move(args), log_path, env);
  pid_ = spawned.pid;
  first_line_ = spawned.first_line;
  address_ = AddressAfter(first_line_, "listening on");
  metrics_address_ = AddressAfter(first_line_, "metrics on");
  http_address_ = AddressAfter(first_line_, "http on");
}

ServerProcess::~ServerProcess() {
  if (pid_ > 0) Stop(SIGKILL);
}

int ServerProcess::Stop(int signal) {
  if (pid_ <= 0) return -1;
  kill(pid_, signal);
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return WEXITSTATUS(status);
}

void ServerProcess::Signal(int signal) const {
  if (pid_ <= 0) return;
  kill(pid_, signal);
  int status = 0;
  if (signal == SIGSTOP) waitpid(pid_, &status, WUNTRACED);
  if (signal == SIGCONT) waitpid(pid_, &status, WCONTINUED);
}

std::string HttpGet(const std::string& address, const std::string& path) {
  const size_t colon = address.rfind(':');
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(std::stoi(address.substr(colon + 1))));
  inet_pton(AF_INET, address.substr(0, colon) == "localhost" ? "127.0.0.1" : address.substr(0, colon).c_str(),
            &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "";
  }
  const std::string request = "GET " + path + " HTTP/1.0\r\nHost: " + address + "\r\n\r\n";
  (void)write(fd, request.data(), request.size());
  std::string response;
  char buffer[4096];
  ssize_t n;
  while ((n = read(fd, buffer, sizeof(buffer))) > 0) response.append(buffer, n);
  close(fd);
  const size_t body = response.find("\r\n\r\n");
  return body == std::string::npos ? "" : response.substr(body + 4);
}

}  // namespace lazykv
