#include "common/server_runtime.h"

#include <signal.h>

#include <iostream>

#include "absl/strings/str_cat.h"

namespace lazykv {
namespace {

sigset_t TerminationSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  return signals;
}

std::string HostOf(const std::string& address) { return address.substr(0, address.rfind(':')); }

}  // namespace

void BlockTerminationSignals() {
  const sigset_t signals = TerminationSignals();
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
}

int WaitForTerminationSignal() {
  const sigset_t signals = TerminationSignals();
  int signal_number = 0;
  sigwait(&signals, &signal_number);
  return signal_number;
}

absl::StatusOr<std::unique_ptr<prometheus::Exposer>> StartMetricsExposer(
    const std::string& address, const std::shared_ptr<prometheus::Registry>& registry) {
  if (address.empty()) return nullptr;
  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    exposer = std::make_unique<prometheus::Exposer>(address);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", address, ": ", e.what()));
  }
  exposer->RegisterCollectable(registry);
  return exposer;
}

void PrintListening(const std::string& name, const std::string& listen, int port, const prometheus::Exposer* exposer,
                    const std::string& metrics_listen) {
  std::cout << name << " listening on " << HostOf(listen) << ":" << port;
  if (exposer != nullptr)
    std::cout << " metrics on " << HostOf(metrics_listen) << ":" << exposer->GetListeningPorts().front();
  std::cout << std::endl;
}

absl::StatusOr<std::unique_ptr<grpc::Server>> StartGrpcServer(const std::string& listen, grpc::Service* service,
                                                              size_t max_message_bytes, int stream_window_bytes,
                                                              int* port) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  *port = 0;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), port);
  builder.RegisterService(service);
  builder.SetMaxReceiveMessageSize(static_cast<int>(max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(max_message_bytes));
  if (stream_window_bytes > 0) builder.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, stream_window_bytes);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 30000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || *port == 0) return absl::UnavailableError(absl::StrCat("cannot listen on ", listen));
  server->GetHealthCheckService()->SetServingStatus(true);
  return server;
}

}  // namespace lazykv
