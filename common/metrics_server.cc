#include "common/metrics_server.h"

#include <httplib.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include "absl/strings/str_cat.h"
#include "common/host_port.h"
#include "common/security/tls_identity_files.h"

namespace lazykv {
absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& address,
                                                                    std::shared_ptr<prometheus::Registry> registry,
                                                                    const ServerSecurityOptions& security,
                                                                    const CallAuthorizer* authorizer) {
  if (address.empty()) return nullptr;
  absl::StatusOr<HostPort> parsed = ParseHostPort(address);
  if (!parsed.ok()) return absl::InvalidArgumentError(absl::StrCat("--metrics-listen ", parsed.status().message()));
  const std::string host = parsed->host;
  const int port = parsed->port;
  const bool tls = !security.tls_cert_file.empty();
  if (!tls && !security.insecure && !IsLoopbackAddress(address)) {
    return absl::InvalidArgumentError(absl::StrCat("--metrics-listen ", address,
                                                   " is not a loopback address: give --tls-cert and --tls-key, or "
                                                   "--insecure to serve metrics in plaintext on it"));
  }
  std::unique_ptr<MetricsServer> metrics(new MetricsServer());
  if (tls) {
    auto identity = TlsIdentityFiles::Open(security.tls_cert_file, security.tls_key_file,
                                           std::chrono::seconds(security.reload_interval_s));
    if (!identity.ok()) return absl::InvalidArgumentError(absl::StrCat("--tls-cert: ", identity.status().message()));
    metrics->identity_ = *std::move(identity);
    TlsIdentityFiles* files = metrics->identity_.get();
    const std::string client_ca = security.tls_client_ca_file;
    metrics->server_ = std::make_unique<httplib::SSLServer>([files, client_ca](SSL_CTX& ctx) {
      SSL_CTX_set_min_proto_version(&ctx, TLS1_2_VERSION);
      files->InstallOn(&ctx);
      if (!client_ca.empty()) {
        if (SSL_CTX_load_verify_locations(&ctx, client_ca.c_str(), nullptr) != 1) return false;
        SSL_CTX_set_verify(&ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
      }
      return true;
    });
    if (!metrics->server_->is_valid()) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot set up TLS for the metrics endpoint: --tls-client-ca ", client_ca, " did not load"));
    }
  } else {
    metrics->server_ = std::make_unique<httplib::Server>();
  }
  httplib::Server& server = *metrics->server_;
  server.new_task_queue = [] { return new httplib::ThreadPool(2); };
  server.set_read_timeout(5, 0);
  server.set_write_timeout(5, 0);
  server.set_keep_alive_timeout(5);
  server.set_payload_max_length(4096);
  server.Get("/metrics", [registry, authorizer](const httplib::Request& request, httplib::Response& response) {
    if (authorizer != nullptr && authorizer->enabled()) {
      const std::string header = request.get_header_value("Authorization");
      const absl::StatusOr<Principal> caller =
          header.starts_with("Bearer ") ? authorizer->AuthorizeToken(std::string_view(header).substr(7), Role::kAdmin)
                                        : absl::UnauthenticatedError("missing 'Authorization: Bearer TOKEN'");
      if (!caller.ok()) {
        const bool denied = caller.status().code() == absl::StatusCode::kPermissionDenied;
        response.status = denied ? 403 : 401;
        if (!denied) response.set_header("WWW-Authenticate", "Bearer realm=\"lazykv\"");
        response.set_content(absl::StrCat(caller.status().message(), "\n"), "text/plain");
        return;
      }
    }
    response.set_content(prometheus::TextSerializer().Serialize(registry->Collect()),
                         "text/plain; version=0.0.4; charset=utf-8");
  });
  metrics->port_ = port == 0 ? server.bind_to_any_port(host) : (server.bind_to_port(host, port) ? port : -1);
  if (metrics->port_ <= 0) return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", address));
  metrics->thread_ = std::thread([&server] { server.listen_after_bind(); });
  // httplib's stop() is lost if it comes before the listen loop runs: return only once it
  // does, so the destructor's stop() always lands.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!server.is_running() && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (!server.is_running()) return absl::UnavailableError(absl::StrCat("metrics on ", address, " did not start"));
  return metrics;
}

MetricsServer::~MetricsServer() {
  if (server_ == nullptr || !thread_.joinable()) return;
  // Repeated until the listen loop has seen it (see Start).
  while (server_->is_running()) {
    server_->stop();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  server_->stop();
  thread_.join();
}

}  // namespace lazykv
