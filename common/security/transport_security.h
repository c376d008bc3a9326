// TLS and mutual TLS for every gRPC port (DESIGN.md section 5b), and the flags that set
// them. Certificates are read through gRPC's file-watcher provider, so a rotated
// certificate, key or CA bundle is picked up without a restart (within the reload
// interval). Plaintext remains for development on loopback: a server refuses to listen
// in plaintext on any other address, and a client refuses to send a bearer token in
// plaintext to one, unless told --insecure.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/flag_parser.h"

namespace lazykv {

struct ServerSecurityOptions {
  std::string tls_cert_file;       // PEM certificate chain; empty: plaintext
  std::string tls_key_file;        // PEM private key of the chain's first certificate
  std::string tls_client_ca_file;  // set: mutual TLS, clients must present a certificate it signed
  std::string auth_tokens_file;    // set: every call needs a bearer token (common/security/bearer_tokens.h)
  bool insecure = false;           // allow plaintext on a non-loopback address
  int reload_interval_s = 10;      // how often certificate and token files are checked for changes
};

extern const char kServerSecurityUsage[];
void AddServerSecurityFlags(FlagParser& parser, ServerSecurityOptions& options);

// Checks the options for a server listening on `listen`: the files exist and parse, the
// key matches the certificate, and plaintext is on loopback or allowed. The error names
// the flag.
absl::Status CheckServerSecurity(const std::string& listen, const ServerSecurityOptions& options);
// REQUIRES: CheckServerSecurity passed.
std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(const ServerSecurityOptions& options);

struct ClientSecurityOptions {
  std::string tls_ca_file;    // set: TLS; the server's certificate must chain to these roots
  std::string tls_cert_file;  // with tls_key_file: this client's certificate, for mutual TLS
  std::string tls_key_file;
  std::string tls_server_name;  // the name checked in the server's certificate (default: the target's host)
  std::string auth_token_file;  // set: "authorization: Bearer <token>" on every call
  bool insecure = false;        // allow sending a token in plaintext to a non-loopback target
  int reload_interval_s = 10;
};

// Usage lines and flags for a client; `prefix` is put before each flag's name (the worker
// uses "cache-" for its connection to the cache servers).
std::string ClientSecurityUsage(std::string_view prefix);
void AddClientSecurityFlags(FlagParser& parser, ClientSecurityOptions& options, std::string_view prefix);

// Checks the options for a client of `target` (HOST:PORT): files readable and parseable,
// a certificate with its key, no plaintext token to a remote host unless allowed.
absl::Status CheckClientSecurity(const std::string& target, const ClientSecurityOptions& options);
// A channel to `target` with the options' credentials and, with a token file, an
// interceptor that sends the token (read again when the file changes) on every call.
// REQUIRES: CheckClientSecurity(target, options) passed.
std::shared_ptr<grpc::Channel> MakeClientChannel(const std::string& target, const ClientSecurityOptions& options,
                                                 grpc::ChannelArguments args = {});

// Whether HOST:PORT (or a unix: address) can only be reached from this machine.
bool IsLoopbackAddress(std::string_view address);

}  // namespace lazykv
