// The client side of bearer tokens: a token file read again when it changes, and a gRPC
// client interceptor that puts "authorization: Bearer <token>" on every call of a channel.
#pragma once

#include <grpcpp/support/client_interceptor.h>

#include <chrono>
#include <memory>
#include <string>

#include "common/mutex.h"

namespace lazykv {

// Thread-safe. The file is checked for changes at most every `check_interval`; a file
// that became unreadable or empty leaves the last token in use.
class ClientToken {
 public:
  ClientToken(std::string path, std::chrono::milliseconds check_interval);
  std::string Current();  // empty when the file never held a token

 private:
  const std::string path_;
  const std::chrono::milliseconds check_interval_;
  Mutex mu_;
  std::string token_ ABSL_GUARDED_BY(mu_);
  std::string version_ ABSL_GUARDED_BY(mu_);
  std::chrono::steady_clock::time_point last_check_ ABSL_GUARDED_BY(mu_);
};

std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface> MakeBearerTokenInterceptorFactory(
    std::shared_ptr<ClientToken> token);

}  // namespace lazykv
