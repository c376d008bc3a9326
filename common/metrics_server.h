// The Prometheus /metrics endpoint of every LazyKV server (DESIGN.md section 6 and 5b):
// GET /metrics in the text exposition format, over HTTPS with the server's certificate
// (reloaded when its files change) and, with mutual TLS, only to clients holding a
// certificate the client CA signed; with a tokens file, a scrape needs
// "Authorization: Bearer TOKEN" of the admin role (Prometheus: `authorization:
// {credentials_file: ...}`). Plaintext only on loopback unless --insecure.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/security/call_authorizer.h"
#include "common/security/transport_security.h"

namespace prometheus {
class Registry;
}

namespace lazykv {

class HttpListener;

// Thread-safe; one thread accepts, two serve. Slow clients are cut off after 5 s of
// silence; request bodies are refused.
class MetricsServer {
 public:
  // Serves `registry` on `address` (HOST:PORT, port 0 picks one); null when `address` is
  // empty. `authorizer` (may be null: no tokens) must outlive the server.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& address,
                                                              std::shared_ptr<prometheus::Registry> registry,
                                                              const ServerSecurityOptions& security,
                                                              const CallAuthorizer* authorizer);
  ~MetricsServer();  // stops serving and joins

  int port() const;

 private:
  MetricsServer() = default;

  std::unique_ptr<HttpListener> listener_;
};

}  // namespace lazykv
