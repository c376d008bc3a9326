// One HTTP(S) listener for every LazyKV HTTP endpoint (/metrics, the OpenAI-compatible
// API): cpp-httplib over TLS with the server's certificate (re-read when its files change,
// common/security/tls_identity_files.h) and, with a client CA, mutual TLS; plaintext only
// on loopback unless --insecure. It owns the server and its accept thread.
#pragma once

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "common/security/transport_security.h"

namespace httplib {
class Server;
}

namespace lazykv {

class TlsIdentityFiles;

// Thread-safe after Start(); routes and options are set on server() before it.
class HttpListener {
 public:
  // A server for `address` (HOST:PORT, port 0 picks one). `flag` names the address's
  // flag in errors ("--metrics-listen").
  static absl::StatusOr<std::unique_ptr<HttpListener>> Create(const std::string& flag, const std::string& address,
                                                              const ServerSecurityOptions& security);
  ~HttpListener();  // stops accepting, lets the handlers return and joins

  httplib::Server& server() { return *server_; }
  // Binds and serves on a thread of its own; returns once the accept loop runs.
  absl::Status Start();
  // Stops accepting and ends keep-alive connections; handlers still running finish.
  void Stop();
  int port() const { return port_; }

 private:
  HttpListener() = default;

  std::string flag_, address_, host_;
  int requested_port_ = 0;
  std::unique_ptr<TlsIdentityFiles> identity_;  // outlives the server's SSL context
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace lazykv
