#include "common/security/call_authorizer.h"

#include <grpc/grpc_security_constants.h>

#include "absl/strings/str_cat.h"

namespace lazykv {
namespace {

constexpr uint8_t kAllRoles =
    static_cast<uint8_t>(Role::kClient) | static_cast<uint8_t>(Role::kWorker) | static_cast<uint8_t>(Role::kAdmin);

std::string PeerHost(std::string peer) {
  // "ipv4:127.0.0.1:5555", "ipv6:[::1]:5555", "unix:/path"
  for (const std::string scheme : {"ipv4:", "ipv6:"}) {
    if (peer.starts_with(scheme)) {
      peer = peer.substr(scheme.size());
      const size_t colon = peer.rfind(':');
      if (colon != std::string::npos) peer = peer.substr(0, colon);
      return peer;
    }
  }
  return peer;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CallAuthorizer>> CallAuthorizer::Create(const std::string& tokens_file,
                                                                       std::chrono::milliseconds reload_interval) {
  if (tokens_file.empty()) return AllowAll();
  absl::StatusOr<std::unique_ptr<TokenFile>> tokens = TokenFile::Open(tokens_file, reload_interval);
  if (!tokens.ok()) return absl::InvalidArgumentError(absl::StrCat("--auth-tokens: ", tokens.status().message()));
  return std::unique_ptr<CallAuthorizer>(new CallAuthorizer(*std::move(tokens)));
}

std::unique_ptr<CallAuthorizer> CallAuthorizer::AllowAll() {
  return std::unique_ptr<CallAuthorizer>(new CallAuthorizer(nullptr));
}

std::string PeerIdentity(const grpc::ServerContext& context) {
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth != nullptr && auth->IsPeerAuthenticated()) {
    for (const grpc::string_ref& name : auth->FindPropertyValues(GRPC_X509_CN_PROPERTY_NAME)) {
      return std::string(name.data(), name.size());
    }
  }
  return PeerHost(context.peer());
}

absl::StatusOr<Principal> CallAuthorizer::Authorize(const grpc::ServerContext& context, Role required) const {
  if (tokens_ == nullptr) return Principal{PeerIdentity(context), kAllRoles};
  const auto& metadata = context.client_metadata();
  auto header = metadata.find("authorization");
  if (header == metadata.end()) {
    return absl::UnauthenticatedError("missing 'authorization: Bearer TOKEN' metadata");
  }
  std::string_view value(header->second.data(), header->second.size());
  if (!value.starts_with("Bearer ")) {
    return absl::UnauthenticatedError("authorization metadata is not 'Bearer TOKEN'");
  }
  return AuthorizeToken(value.substr(7), required);
}

absl::StatusOr<Principal> CallAuthorizer::AuthorizeHttpHeader(std::string_view authorization, Role required) const {
  if (!authorization.starts_with("Bearer ")) {
    return absl::UnauthenticatedError("missing 'Authorization: Bearer TOKEN'");
  }
  return AuthorizeToken(authorization.substr(7), required);
}

absl::StatusOr<Principal> CallAuthorizer::AuthorizeToken(std::string_view token, Role required) const {
  if (tokens_ == nullptr) return Principal{"", kAllRoles};
  std::optional<Principal> principal = tokens_->Find(token);
  if (!principal.has_value()) return absl::UnauthenticatedError("unknown bearer token");
  if (!principal->Has(required)) {
    return absl::PermissionDeniedError(absl::StrCat("'", principal->name, "' lacks the '",
                                                    std::string(RoleName(required)), "' role this method needs"));
  }
  return *std::move(principal);
}

}  // namespace lazykv
