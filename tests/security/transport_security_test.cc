// The checks a server and a client make of their security flags before starting:
// loopback detection, certificate/key pairs, and no plaintext off loopback unless asked.
#include "common/security/transport_security.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "tests/security/security_test_util.h"

namespace lazykv {
namespace {

TEST(TransportSecurityTest, KnowsWhichAddressesAreLoopback) {
  for (const char* address : {"127.0.0.1:50051", "127.3.2.1:1", "localhost:80", "[::1]:443", "ipv4:127.0.0.1:9",
                              "unix:/tmp/socket", "dns:///localhost:5"}) {
    EXPECT_TRUE(IsLoopbackAddress(address)) << address;
  }
  for (const char* address : {"0.0.0.0:50051", "[::]:50051", "10.0.0.7:50051", "cache-0.cache:50051", "128.0.0.1:1",
                              "localhost.example.com:1", "[::2]:1"}) {
    EXPECT_FALSE(IsLoopbackAddress(address)) << address;
  }
}

TEST(TransportSecurityTest, ServerRefusesPlaintextOffLoopbackUnlessInsecure) {
  ServerSecurityOptions plain;
  EXPECT_TRUE(CheckServerSecurity("127.0.0.1:0", plain).ok());
  absl::Status refused = CheckServerSecurity("0.0.0.0:50051", plain);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("--insecure"), std::string::npos) << refused;
  plain.insecure = true;
  EXPECT_TRUE(CheckServerSecurity("0.0.0.0:50051", plain).ok());
}

TEST(TransportSecurityTest, ServerChecksItsCertificateKeyAndClientCa) {
  const testing::DevCerts certs = testing::MakeDevCerts();
  const testing::DevCerts other = testing::MakeDevCerts();
  ServerSecurityOptions tls{.tls_cert_file = certs.server_cert, .tls_key_file = certs.server_key};
  EXPECT_TRUE(CheckServerSecurity("0.0.0.0:50051", tls).ok());
  tls.tls_client_ca_file = certs.ca;
  EXPECT_TRUE(CheckServerSecurity("0.0.0.0:50051", tls).ok());

  ServerSecurityOptions mismatched{.tls_cert_file = certs.server_cert, .tls_key_file = other.server_key};
  absl::Status s = CheckServerSecurity("127.0.0.1:0", mismatched);
  EXPECT_NE(s.message().find("--tls-key: the key in"), std::string::npos) << s;

  ServerSecurityOptions half{.tls_cert_file = certs.server_cert};
  EXPECT_NE(CheckServerSecurity("127.0.0.1:0", half).message().find("go together"), std::string::npos);

  ServerSecurityOptions not_pem{.tls_cert_file = certs.tokens, .tls_key_file = certs.server_key};
  s = CheckServerSecurity("127.0.0.1:0", not_pem);
  EXPECT_NE(s.message().find("--tls-cert: " + certs.tokens + " holds no PEM certificate"), std::string::npos) << s;

  ServerSecurityOptions missing{.tls_cert_file = certs.dir + "/absent.pem", .tls_key_file = certs.server_key};
  EXPECT_NE(CheckServerSecurity("127.0.0.1:0", missing).message().find("absent.pem"), std::string::npos);

  ServerSecurityOptions ca_without_cert{.tls_client_ca_file = certs.ca};
  EXPECT_FALSE(CheckServerSecurity("127.0.0.1:0", ca_without_cert).ok());
}

TEST(TransportSecurityTest, ClientRefusesToSendATokenInPlaintextOffLoopback) {
  const testing::DevCerts certs = testing::MakeDevCerts();
  ClientSecurityOptions token{.auth_token_file = certs.worker_token};
  EXPECT_TRUE(CheckClientSecurity("127.0.0.1:5000", token).ok());
  absl::Status s = CheckClientSecurity("cache-0.cache:5000", token);
  EXPECT_NE(s.message().find("plaintext"), std::string::npos) << s;
  token.tls_ca_file = certs.ca;
  EXPECT_TRUE(CheckClientSecurity("cache-0.cache:5000", token).ok());

  ClientSecurityOptions cert_without_ca{.tls_cert_file = certs.client_cert, .tls_key_file = certs.client_key};
  EXPECT_FALSE(CheckClientSecurity("127.0.0.1:5000", cert_without_ca).ok());
  ClientSecurityOptions empty_token{.auth_token_file = certs.dir + "/empty"};
  std::ofstream(empty_token.auth_token_file) << "\n";
  EXPECT_NE(CheckClientSecurity("127.0.0.1:5000", empty_token).message().find("is empty"), std::string::npos);
}

}  // namespace
}  // namespace lazykv
