#include "common/security/tls_identity_files.h"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <spdlog/spdlog.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/security/secret_file.h"

namespace lazykv {

struct TlsIdentityFiles::Pair {
  X509* leaf = nullptr;
  STACK_OF(X509) * chain = nullptr;  // the certificates after the leaf
  EVP_PKEY* key = nullptr;
  ~Pair() {
    X509_free(leaf);
    sk_X509_pop_free(chain, X509_free);
    EVP_PKEY_free(key);
  }
};

TlsIdentityFiles::TlsIdentityFiles(std::string cert_file, std::string key_file,
                                   std::chrono::milliseconds check_interval)
    : cert_file_(std::move(cert_file)), key_file_(std::move(key_file)), check_interval_(check_interval) {}

TlsIdentityFiles::~TlsIdentityFiles() = default;

absl::StatusOr<std::shared_ptr<const TlsIdentityFiles::Pair>> TlsIdentityFiles::Read(const std::string& cert_file,
                                                                                     const std::string& key_file) {
  auto pair = std::make_shared<Pair>();
  auto open = [](const std::string& path) -> BIO* { return BIO_new_file(path.c_str(), "r"); };
  BIO* certs = open(cert_file);
  if (certs == nullptr) return absl::InvalidArgumentError(absl::StrCat("cannot read ", cert_file));
  pair->leaf = PEM_read_bio_X509(certs, nullptr, nullptr, nullptr);
  pair->chain = sk_X509_new_null();
  while (X509* next = PEM_read_bio_X509(certs, nullptr, nullptr, nullptr)) sk_X509_push(pair->chain, next);
  BIO_free(certs);
  BIO* key = open(key_file);
  if (key == nullptr) return absl::InvalidArgumentError(absl::StrCat("cannot read ", key_file));
  // An encrypted key is refused, never prompted for on the terminal.
  pair->key = PEM_read_bio_PrivateKey(key, nullptr, [](char*, int, int, void*) { return 0; }, nullptr);
  BIO_free(key);
  ERR_clear_error();  // the chain's loop ends on a "no start line" error
  if (pair->leaf == nullptr) return absl::InvalidArgumentError(absl::StrCat(cert_file, " holds no PEM certificate"));
  if (pair->key == nullptr) return absl::InvalidArgumentError(absl::StrCat(key_file, " holds no PEM private key"));
  if (X509_check_private_key(pair->leaf, pair->key) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(absl::StrCat("the key in ", key_file, " does not match ", cert_file));
  }
  return std::shared_ptr<const Pair>(std::move(pair));
}

absl::StatusOr<std::unique_ptr<TlsIdentityFiles>> TlsIdentityFiles::Open(std::string cert_file, std::string key_file,
                                                                         std::chrono::milliseconds check_interval) {
  std::unique_ptr<TlsIdentityFiles> files(
      new TlsIdentityFiles(std::move(cert_file), std::move(key_file), check_interval));
  const std::string version = FileVersion(files->cert_file_) + FileVersion(files->key_file_);
  absl::StatusOr<std::shared_ptr<const Pair>> pair = Read(files->cert_file_, files->key_file_);
  if (!pair.ok()) return pair.status();
  MutexLock lock(&files->mu_);
  files->pair_ = *std::move(pair);
  files->version_ = version;
  files->last_check_ = std::chrono::steady_clock::now();
  return files;
}

std::shared_ptr<const TlsIdentityFiles::Pair> TlsIdentityFiles::Current() {
  MutexLock lock(&mu_);
  const auto now = std::chrono::steady_clock::now();
  if (now - last_check_ >= check_interval_) {
    last_check_ = now;
    const std::string version = FileVersion(cert_file_) + FileVersion(key_file_);
    if (version != version_) {
      version_ = version;  // a bad pair is reported once
      absl::StatusOr<std::shared_ptr<const Pair>> pair = Read(cert_file_, key_file_);
      if (pair.ok()) {
        pair_ = *std::move(pair);
        spdlog::info("TLS certificate {} reloaded", cert_file_);
      } else {
        spdlog::error("TLS certificate changed but cannot be used ({}); keeping the previous one",
                      std::string(pair.status().message()));
      }
    }
  }
  return pair_;
}

int TlsIdentityFiles::CertCallback(SSL* ssl, void* self) {
  std::shared_ptr<const Pair> pair = static_cast<TlsIdentityFiles*>(self)->Current();
  // SSL_use_cert_and_key takes its own references; `override` replaces what was set.
  return SSL_use_cert_and_key(ssl, pair->leaf, pair->key, pair->chain, /*override=*/1) == 1 ? 1 : 0;
}

void TlsIdentityFiles::InstallOn(SSL_CTX* ctx) { SSL_CTX_set_cert_cb(ctx, &TlsIdentityFiles::CertCallback, this); }

}  // namespace lazykv
