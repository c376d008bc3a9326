// A certificate chain and its private key read from PEM files, read again when either
// file changes, for OpenSSL servers of our own (the /metrics endpoint). gRPC ports use
// gRPC's file-watcher provider instead (transport_security.h).
#pragma once

#include <openssl/ssl.h>

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/mutex.h"

namespace lazykv {

// Thread-safe.
class TlsIdentityFiles {
 public:
  // Both files must parse and belong together now; the error names them.
  static absl::StatusOr<std::unique_ptr<TlsIdentityFiles>> Open(std::string cert_file, std::string key_file,
                                                                std::chrono::milliseconds check_interval);
  ~TlsIdentityFiles();

  // Makes `ctx` present the current certificate on every handshake (an OpenSSL
  // certificate callback), picking up new files within the check interval. A change that
  // does not parse, or whose key does not match, is logged and the previous pair kept.
  // REQUIRES: this outlives `ctx`.
  void InstallOn(SSL_CTX* ctx);

 private:
  struct Pair;
  TlsIdentityFiles(std::string cert_file, std::string key_file, std::chrono::milliseconds check_interval);
  static absl::StatusOr<std::shared_ptr<const Pair>> Read(const std::string& cert_file, const std::string& key_file);
  std::shared_ptr<const Pair> Current();
  static int CertCallback(SSL* ssl, void* self);

  const std::string cert_file_, key_file_;
  const std::chrono::milliseconds check_interval_;
  Mutex mu_;
  std::shared_ptr<const Pair> pair_ ABSL_GUARDED_BY(mu_);
  std::string version_ ABSL_GUARDED_BY(mu_);
  std::chrono::steady_clock::time_point last_check_ ABSL_GUARDED_BY(mu_);
};

}  // namespace lazykv
