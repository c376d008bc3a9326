#include "common/metrics_server.h"

#include <httplib.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include "absl/strings/str_cat.h"
#include "common/security/tls_identity_files.h"

namespace lazykv {
namespace {

std::pair<std::string, int> SplitHostPort(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return {address, -1};
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  try {
    return {host, std::stoi(address.substr(colon + 1))};
  } catch (const std::exception&) {
    return {host, -1};
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& address,
                                                                    std::shared_ptr<prometheus::Registry> registry,
                                                                    const ServerSecurityOptions& security,
                                                                    const CallAuthorizer* authorizer) {
  if (address.empty()) return nullptr;
  const auto [host, port] = SplitHostPort(address);
  if (port < 0 || port > 65535)
    return absl::InvalidArgumentError(absl::StrCat("--metrics-listen ", address, ": expected HOST:PORT"));
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
    if (!metrics->server_->is_valid()) return absl::InternalError("cannot set up TLS for the metrics endpoint");
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
  return metrics;
}

MetricsServer::~MetricsServer() {
  if (server_ != nullptr) server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace lazykv
