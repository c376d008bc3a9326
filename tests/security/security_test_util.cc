#include "tests/security/security_test_util.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "common/security/secret_file.h"
#include "tests/test_util.h"

namespace lazykv::testing {

DevCerts MakeDevCerts(const std::string& extra_names) {
  DevCerts c;
  c.dir = (std::filesystem::temp_directory_path() / ("lazykv_certs_" + std::to_string(FreshSeed()))).string();
  const std::string command =
      std::string(LAZYKV_SOURCE_DIR) + "/scripts/make_dev_certs.sh " + c.dir + " " + extra_names + " >/dev/null";
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
  c.ca = c.dir + "/ca.pem";
  c.server_cert = c.dir + "/server.pem";
  c.server_key = c.dir + "/server.key";
  c.client_cert = c.dir + "/client.pem";
  c.client_key = c.dir + "/client.key";
  c.tokens = c.dir + "/tokens";
  c.client_token = c.dir + "/client.token";
  c.worker_token = c.dir + "/worker.token";
  c.admin_token = c.dir + "/admin.token";
  return c;
}

std::string DevCerts::Token(const std::string& file) const {
  absl::StatusOr<std::string> token = ReadSecretFile(file);
  EXPECT_TRUE(token.ok()) << token.status();
  return token.ok() ? *token : "";
}

}  // namespace lazykv::testing
