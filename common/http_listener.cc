#include "common/http_listener.h"

#include <httplib.h>

#include "absl/strings/str_cat.h"
#include "common/host_port.h"
#include "common/security/tls_identity_files.h"

namespace lazykv {

absl::StatusOr<std::unique_ptr<HttpListener>> HttpListener::Create(const std::string& flag, const std::string& address,
                                                                   const ServerSecurityOptions& security) {
  absl::StatusOr<HostPort> parsed = ParseHostPort(address);
  if (!parsed.ok()) return absl::InvalidArgumentError(absl::StrCat(flag, " ", parsed.status().message()));
  const bool tls = !security.tls_cert_file.empty();
  if (!tls && !security.insecure && !IsLoopbackAddress(address)) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", address,
                                                   " is not a loopback address: give --tls-cert and --tls-key, or "
                                                   "--insecure to serve plaintext on it"));
  }
  std::unique_ptr<HttpListener> listener(new HttpListener());
  listener->flag_ = flag;
  listener->address_ = address;
  listener->host_ = parsed->host;
  listener->requested_port_ = parsed->port;
  if (tls) {
    auto identity = TlsIdentityFiles::Open(security.tls_cert_file, security.tls_key_file,
                                           std::chrono::seconds(security.reload_interval_s));
    if (!identity.ok()) return absl::InvalidArgumentError(absl::StrCat("--tls-cert: ", identity.status().message()));
    listener->identity_ = *std::move(identity);
    TlsIdentityFiles* files = listener->identity_.get();
    const std::string client_ca = security.tls_client_ca_file;
    listener->server_ = std::make_unique<httplib::SSLServer>([files, client_ca](SSL_CTX& ctx) {
      SSL_CTX_set_min_proto_version(&ctx, TLS1_2_VERSION);
      files->InstallOn(&ctx);
      if (!client_ca.empty()) {
        if (SSL_CTX_load_verify_locations(&ctx, client_ca.c_str(), nullptr) != 1) return false;
        SSL_CTX_set_verify(&ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
      }
      return true;
    });
    if (!listener->server_->is_valid()) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot set up TLS for ", flag, ": --tls-client-ca ", client_ca, " did not load"));
    }
  } else {
    listener->server_ = std::make_unique<httplib::Server>();
  }
  return listener;
}

absl::Status HttpListener::Start() {
  httplib::Server& server = *server_;
  port_ = requested_port_ == 0 ? server.bind_to_any_port(host_)
                               : (server.bind_to_port(host_, requested_port_) ? requested_port_ : -1);
  if (port_ <= 0) return absl::UnavailableError(absl::StrCat(flag_, ": cannot listen on ", address_));
  thread_ = std::thread([&server] { server.listen_after_bind(); });
  // httplib's stop() is lost if it comes before the listen loop runs: return only once it
  // does, so that Stop() always lands.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!server.is_running() && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (!server.is_running()) return absl::UnavailableError(absl::StrCat(flag_, ": ", address_, " did not start"));
  return absl::OkStatus();
}

void HttpListener::Stop() {
  if (server_ == nullptr || !thread_.joinable()) return;
  // Repeated until the listen loop has seen it (see Start).
  while (server_->is_running()) {
    server_->stop();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  server_->stop();
  thread_.join();
}

HttpListener::~HttpListener() { Stop(); }

}  // namespace lazykv
