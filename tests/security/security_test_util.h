// Certificates and tokens for the security tests, made by scripts/make_dev_certs.sh (the
// script users run) in a fresh directory.
#pragma once

#include <string>

namespace lazykv::testing {

struct DevCerts {
  std::string dir;
  std::string ca, server_cert, server_key, client_cert, client_key;
  std::string tokens, client_token, worker_token, admin_token;  // files
  std::string Token(const std::string& file) const;             // a token file's contents
};

// A new CA and certificate set each call; fails the test when the script fails.
DevCerts MakeDevCerts(const std::string& extra_names = "");

}  // namespace lazykv::testing
