// The server side of authorization: each RPC handler asks, first thing, whether its
// caller holds the role the method needs (DESIGN.md section 5b).
#pragma once

#include <grpcpp/server_context.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/security/bearer_tokens.h"

namespace lazykv {

// Thread-safe.
class CallAuthorizer {
 public:
  // With no tokens file every call is allowed (a server without --auth-tokens).
  static absl::StatusOr<std::unique_ptr<CallAuthorizer>> Create(const std::string& tokens_file,
                                                                std::chrono::milliseconds reload_interval);
  static std::unique_ptr<CallAuthorizer> AllowAll();

  // The caller, when its "authorization: Bearer TOKEN" names a principal with `required`.
  // UNAUTHENTICATED when the header is missing, malformed or the token unknown;
  // PERMISSION_DENIED when the principal lacks the role. Without tokens: a principal
  // named by the peer's certificate (mutual TLS) or its host, with every role.
  absl::StatusOr<Principal> Authorize(const grpc::ServerContext& context, Role required) const;
  // The same check for a token given some other way (the metrics endpoint's basic auth).
  absl::StatusOr<Principal> AuthorizeToken(std::string_view token, Role required) const;
  // The same check for an HTTP request's "Authorization" header value ("" when absent):
  // UNAUTHENTICATED unless it is "Bearer TOKEN" with a known token.
  absl::StatusOr<Principal> AuthorizeHttpHeader(std::string_view authorization, Role required) const;
  bool enabled() const { return tokens_ != nullptr; }

 private:
  explicit CallAuthorizer(std::unique_ptr<TokenFile> tokens) : tokens_(std::move(tokens)) {}
  std::unique_ptr<TokenFile> tokens_;
};

// Who is calling, for limits and logs when no token names it: the common name of the
// peer's verified certificate, else the peer's host ("127.0.0.1").
std::string PeerIdentity(const grpc::ServerContext& context);

}  // namespace lazykv
