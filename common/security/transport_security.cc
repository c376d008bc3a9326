#include "common/security/transport_security.h"

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <grpcpp/support/client_interceptor.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <arpa/inet.h>
#include <netinet/in.h>

#include "absl/strings/str_cat.h"
#include "common/host_port.h"
#include "common/security/client_token.h"
#include "common/security/secret_file.h"

namespace lazykv {
namespace {

using grpc::experimental::FileWatcherCertificateProvider;

std::string OpenSslError() {
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return "no PEM data";
  char text[256];
  ERR_error_string_n(code, text, sizeof(text));
  return text;
}

struct BioDeleter {
  void operator()(BIO* bio) const { BIO_free(bio); }
};
using BioPtr = std::unique_ptr<BIO, BioDeleter>;

absl::StatusOr<BioPtr> OpenPem(const std::string& flag, const std::string& path) {
  absl::StatusOr<std::string> text = ReadSecretFile(path);
  if (!text.ok()) return absl::InvalidArgumentError(absl::StrCat(flag, ": ", text.status().message()));
  BioPtr bio(BIO_new(BIO_s_mem()));
  BIO_write(bio.get(), text->data(), static_cast<int>(text->size()));
  return bio;
}

// The first certificate of a PEM file; X509_free it.
absl::StatusOr<X509*> ReadCertificate(const std::string& flag, const std::string& path) {
  absl::StatusOr<BioPtr> bio = OpenPem(flag, path);
  if (!bio.ok()) return bio.status();
  X509* cert = PEM_read_bio_X509(bio->get(), nullptr, nullptr, nullptr);
  if (cert == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": ", path, " holds no PEM certificate (", OpenSslError(), ")"));
  }
  return cert;
}

absl::Status CheckCertificateFile(const std::string& flag, const std::string& path) {
  absl::StatusOr<X509*> cert = ReadCertificate(flag, path);
  if (!cert.ok()) return cert.status();
  X509_free(*cert);
  return absl::OkStatus();
}

// The certificate and key files parse and belong together.
absl::Status CheckKeyPair(const std::string& cert_flag, const std::string& cert_path, const std::string& key_flag,
                          const std::string& key_path) {
  if (cert_path.empty() != key_path.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(cert_flag, " and ", key_flag, " go together"));
  }
  if (cert_path.empty()) return absl::OkStatus();
  absl::StatusOr<X509*> cert = ReadCertificate(cert_flag, cert_path);
  if (!cert.ok()) return cert.status();
  std::unique_ptr<X509, decltype(&X509_free)> cert_owner(*cert, X509_free);
  absl::StatusOr<BioPtr> bio = OpenPem(key_flag, key_path);
  if (!bio.ok()) return bio.status();
  // An encrypted key is refused, never prompted for on the terminal.
  EVP_PKEY* key = PEM_read_bio_PrivateKey(bio->get(), nullptr, [](char*, int, int, void*) { return 0; }, nullptr);
  if (key == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(key_flag, ": ", key_path, " holds no PEM private key (", OpenSslError(), ")"));
  }
  const bool match = X509_check_private_key(*cert, key) == 1;
  EVP_PKEY_free(key);
  ERR_clear_error();
  if (!match) {
    return absl::InvalidArgumentError(
        absl::StrCat(key_flag, ": the key in ", key_path, " does not match the certificate in ", cert_path));
  }
  return absl::OkStatus();
}

}  // namespace

bool IsLoopbackAddress(std::string_view address) {
  if (address.starts_with("unix:") || address.starts_with("unix-abstract:")) return true;
  // One literal address only: a list ("ipv4:127.0.0.1:1,10.0.0.5:2") or a name that merely
  // starts like one ("dns:///127.evil.example:1") is not loopback.
  if (address.find(',') != std::string_view::npos) return false;
  for (std::string_view scheme : {"dns:///", "ipv4:", "ipv6:"}) {
    if (address.starts_with(scheme)) address.remove_prefix(scheme.size());
  }
  absl::StatusOr<HostPort> parsed = ParseHostPort(address);
  if (!parsed.ok()) return false;
  if (parsed->host == "localhost") return true;
  in_addr v4;
  if (inet_pton(AF_INET, parsed->host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6;
  return inet_pton(AF_INET6, parsed->host.c_str(), &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6);
}

const char kServerSecurityUsage[] =
    R"(  --tls-cert FILE          serve TLS with this PEM certificate chain (with --tls-key)
  --tls-key FILE           the PEM private key of --tls-cert
  --tls-client-ca FILE     mutual TLS: clients must present a certificate signed by these CAs
  --auth-tokens FILE       require a bearer token with a role on every call: lines of
                           "TOKEN NAME ROLE[,ROLE]" (roles: client, worker, admin)
  --tls-reload-s N         check certificate, CA and token files for changes every N s (default 10)
  --insecure               allow plaintext on a non-loopback --listen address
)";

void AddServerSecurityFlags(FlagParser& parser, ServerSecurityOptions& options) {
  parser.AddString("--tls-cert", &options.tls_cert_file);
  parser.AddString("--tls-key", &options.tls_key_file);
  parser.AddString("--tls-client-ca", &options.tls_client_ca_file);
  parser.AddString("--auth-tokens", &options.auth_tokens_file);
  parser.AddInt("--tls-reload-s", &options.reload_interval_s);
  parser.AddSwitch("--insecure", &options.insecure);
}

absl::Status CheckServerSecurity(const std::string& listen, const ServerSecurityOptions& options) {
  if (options.reload_interval_s <= 0) return absl::InvalidArgumentError("--tls-reload-s must be positive");
  if (absl::Status s = CheckKeyPair("--tls-cert", options.tls_cert_file, "--tls-key", options.tls_key_file); !s.ok()) {
    return s;
  }
  if (!options.tls_client_ca_file.empty()) {
    if (options.tls_cert_file.empty())
      return absl::InvalidArgumentError("--tls-client-ca needs --tls-cert and --tls-key");
    if (absl::Status s = CheckCertificateFile("--tls-client-ca", options.tls_client_ca_file); !s.ok()) return s;
  }
  if (options.tls_cert_file.empty() && !options.insecure && !IsLoopbackAddress(listen)) {
    return absl::InvalidArgumentError(absl::StrCat("--listen ", listen,
                                                   " is not a loopback address: give --tls-cert and --tls-key, or "
                                                   "--insecure to serve plaintext on it"));
  }
  return absl::OkStatus();
}

std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(const ServerSecurityOptions& options) {
  if (options.tls_cert_file.empty()) return grpc::InsecureServerCredentials();
  auto provider = std::make_shared<FileWatcherCertificateProvider>(options.tls_key_file, options.tls_cert_file,
                                                                   options.tls_client_ca_file,
                                                                   static_cast<unsigned>(options.reload_interval_s));
  grpc::experimental::TlsServerCredentialsOptions tls(provider);
  tls.watch_identity_key_cert_pairs();
  if (!options.tls_client_ca_file.empty()) {
    tls.watch_root_certs();
    tls.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  } else {
    tls.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  }
  return grpc::experimental::TlsServerCredentials(tls);
}

std::string ClientSecurityUsage(std::string_view prefix) {
  const std::string p = absl::StrCat("--", std::string(prefix));
  return absl::StrCat("  ", p, "tls-ca FILE   use TLS; the server's certificate must chain to these PEM roots\n",  //
                      "  ", p, "tls-cert FILE, ", p, "tls-key FILE  this client's certificate, for mutual TLS\n", "  ",
                      p, "tls-server-name NAME  the name expected in the server's certificate\n", "  ", p,
                      "auth-token FILE  send the bearer token in FILE on every call\n", "  ", p,
                      "insecure     allow sending a token in plaintext to a non-loopback address\n");
}

void AddClientSecurityFlags(FlagParser& parser, ClientSecurityOptions& options, std::string_view prefix) {
  const std::string p = absl::StrCat("--", std::string(prefix));
  parser.AddString(p + "tls-ca", &options.tls_ca_file);
  parser.AddString(p + "tls-cert", &options.tls_cert_file);
  parser.AddString(p + "tls-key", &options.tls_key_file);
  parser.AddString(p + "tls-server-name", &options.tls_server_name);
  parser.AddString(p + "auth-token", &options.auth_token_file);
  parser.AddSwitch(p + "insecure", &options.insecure);
}

absl::Status CheckClientSecurity(const std::string& target, const ClientSecurityOptions& options) {
  if (!options.tls_ca_file.empty()) {
    if (absl::Status s = CheckCertificateFile("tls-ca", options.tls_ca_file); !s.ok()) return s;
  } else if (!options.tls_cert_file.empty()) {
    return absl::InvalidArgumentError("tls-cert: a client certificate needs tls-ca (TLS) as well");
  }
  if (absl::Status s = CheckKeyPair("tls-cert", options.tls_cert_file, "tls-key", options.tls_key_file); !s.ok()) {
    return s;
  }
  if (!options.auth_token_file.empty()) {
    absl::StatusOr<std::string> token = ReadSecretFile(options.auth_token_file);
    if (!token.ok()) return absl::InvalidArgumentError(absl::StrCat("auth-token: ", token.status().message()));
    if (token->empty())
      return absl::InvalidArgumentError(absl::StrCat("auth-token: ", options.auth_token_file, " is empty"));
    if (options.tls_ca_file.empty() && !options.insecure && !IsLoopbackAddress(target)) {
      return absl::InvalidArgumentError(absl::StrCat("auth-token: would send the token in plaintext to ", target,
                                                     "; use tls-ca, or insecure to allow it"));
    }
  }
  return absl::OkStatus();
}

std::shared_ptr<grpc::Channel> MakeClientChannel(const std::string& target, const ClientSecurityOptions& options,
                                                 grpc::ChannelArguments args) {
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  if (options.tls_ca_file.empty()) {
    credentials = grpc::InsecureChannelCredentials();
  } else {
    const unsigned interval = static_cast<unsigned>(options.reload_interval_s);
    auto provider = options.tls_cert_file.empty()
                        ? std::make_shared<FileWatcherCertificateProvider>(options.tls_ca_file, interval)
                        : std::make_shared<FileWatcherCertificateProvider>(options.tls_key_file, options.tls_cert_file,
                                                                           options.tls_ca_file, interval);
    grpc::experimental::TlsChannelCredentialsOptions tls;
    tls.set_certificate_provider(provider);
    tls.watch_root_certs();
    if (!options.tls_cert_file.empty()) tls.watch_identity_key_cert_pairs();
    credentials = grpc::experimental::TlsCredentials(tls);
    if (!options.tls_server_name.empty()) args.SetSslTargetNameOverride(options.tls_server_name);
  }
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  if (!options.auth_token_file.empty()) {
    interceptors.push_back(MakeBearerTokenInterceptorFactory(
        std::make_shared<ClientToken>(options.auth_token_file, std::chrono::seconds(options.reload_interval_s))));
  }
  return grpc::experimental::CreateCustomChannelWithInterceptors(target, credentials, args, std::move(interceptors));
}

}  // namespace lazykv
