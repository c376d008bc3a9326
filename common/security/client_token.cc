#include "common/security/client_token.h"

#include <grpcpp/support/interceptor.h>

#include "absl/strings/str_cat.h"
#include "common/security/secret_file.h"

namespace lazykv {
namespace {

using grpc::experimental::InterceptionHookPoints;

class BearerTokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit BearerTokenInterceptor(ClientToken* token) : token_(token) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      const std::string token = token_->Current();
      if (!token.empty()) methods->GetSendInitialMetadata()->emplace("authorization", absl::StrCat("Bearer ", token));
    }
    methods->Proceed();
  }

 private:
  ClientToken* token_;
};

class BearerTokenInterceptorFactory final : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerTokenInterceptorFactory(std::shared_ptr<ClientToken> token) : token_(std::move(token)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(grpc::experimental::ClientRpcInfo*) override {
    return new BearerTokenInterceptor(token_.get());
  }

 private:
  std::shared_ptr<ClientToken> token_;
};

}  // namespace

ClientToken::ClientToken(std::string path, std::chrono::milliseconds check_interval)
    : path_(std::move(path)), check_interval_(check_interval) {}

std::string ClientToken::Current() {
  MutexLock lock(&mu_);
  const auto now = std::chrono::steady_clock::now();
  if (version_.empty() || now - last_check_ >= check_interval_) {
    last_check_ = now;
    const std::string version = FileVersion(path_);
    if (version != version_) {
      absl::StatusOr<std::string> token = ReadSecretFile(path_);
      if (token.ok() && !token->empty()) {
        token_ = *std::move(token);
        version_ = version;
      }
    }
  }
  return token_;
}

std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface> MakeBearerTokenInterceptorFactory(
    std::shared_ptr<ClientToken> token) {
  return std::make_unique<BearerTokenInterceptorFactory>(std::move(token));
}

}  // namespace lazykv
