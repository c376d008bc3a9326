// StartGrpcServer's connection limits (common/server_runtime.h): a socket that connects and
// never completes its handshake is closed at the handshake timeout, not held; a real client's
// calls are served meanwhile.
#include "common/server_runtime.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>

#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "gtest/gtest.h"
#include "proto/generate.grpc.pb.h"
#include "tests/test_util.h"

namespace lazykv {
namespace {

using testing::SlowdownFactor;

// Seconds until the server closes a connection on which nothing is sent (-1: not within
// `limit_s`).
double SecondsUntilClosed(int port, int limit_s) {
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0) return -1;
  timeval timeout{.tv_sec = limit_s, .tv_usec = 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  const auto start = std::chrono::steady_clock::now();
  char byte;
  ssize_t got;
  while ((got = recv(fd, &byte, 1, 0)) > 0) {  // the server's own HTTP/2 preface may come first
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  close(fd);
  return got == 0 || (got < 0 && errno == ECONNRESET) ? seconds : -1;
}

TEST(ServerRuntimeTest, ASilentConnectionIsClosedAtTheHandshakeTimeout) {
  v1::Generation::Service service;  // every method UNIMPLEMENTED: only the connections matter
  int port = 0;
  GrpcServerOptions options;
  options.listen = "127.0.0.1:0";
  options.handshake_timeout_ms = 500 * SlowdownFactor();
  auto server = StartGrpcServer(options, &service, &port);
  ASSERT_TRUE(server.ok()) << server.status();
  const double closed_after = SecondsUntilClosed(port, 20 * SlowdownFactor());
  EXPECT_GE(closed_after, 0.3 * SlowdownFactor()) << "closed before the timeout";
  EXPECT_GT(closed_after, 0) << "not closed within 20 s (gRPC's default waits 120 s)";
  EXPECT_LT(closed_after, 5.0 * SlowdownFactor());
  // A client that speaks gRPC is served: the health service answers.
  auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials());
  v1::Generation::Stub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10 * SlowdownFactor()));
  v1::TokenizeRequest request;
  v1::TokenizeResponse reply;
  EXPECT_EQ(stub.Tokenize(&context, request, &reply).error_code(), grpc::StatusCode::UNIMPLEMENTED);
  (*server)->Shutdown(std::chrono::system_clock::now());
}

}  // namespace
}  // namespace lazykv
