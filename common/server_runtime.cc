#include "common/server_runtime.h"

#include <signal.h>
#include <sys/resource.h>

#include <iostream>

#include "absl/strings/str_cat.h"
#include "common/env_switch.h"

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
  // A peer that goes away mid-write (a TLS scrape of /metrics) must cost that connection an
  // EPIPE, not the process its life.
  signal(SIGPIPE, SIG_IGN);
}

int WaitForTerminationSignal() {
  const sigset_t signals = TerminationSignals();
  int signal_number = 0;
  sigwait(&signals, &signal_number);
  return signal_number;
}

void PrintListening(const std::string& name, const std::string& listen, int port, const MetricsServer* metrics,
                    const std::string& metrics_listen, const std::string& http_listen, int http_port) {
  std::cout << name << " listening on " << HostOf(listen) << ":" << port;
  if (metrics != nullptr) std::cout << " metrics on " << HostOf(metrics_listen) << ":" << metrics->port();
  if (http_port > 0) std::cout << " http on " << HostOf(http_listen) << ":" << http_port;
  std::cout << std::endl;
}

namespace {

// The process's soft limit on open descriptors raised to its hard limit, once.
void RaiseDescriptorLimit() {
  static const bool raised = [] {
    rlimit limit{};
    if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= limit.rlim_max) return false;
    limit.rlim_cur = limit.rlim_max;
    return setrlimit(RLIMIT_NOFILE, &limit) == 0;
  }();
  (void)raised;
}

}  // namespace

absl::StatusOr<std::unique_ptr<grpc::Server>> StartGrpcServer(const GrpcServerOptions& options, grpc::Service* service,
                                                              int* port) {
  RaiseDescriptorLimit();
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  *port = 0;
  builder.AddListeningPort(
      options.listen, options.credentials != nullptr ? options.credentials : grpc::InsecureServerCredentials(), port);
  builder.RegisterService(service);
  builder.SetMaxReceiveMessageSize(static_cast<int>(options.max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(options.max_message_bytes));
  if (options.stream_window_bytes > 0) {
    builder.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, options.stream_window_bytes);
  }
  if (options.max_threads > 0) {
    // Past this many handler threads a new call is refused with RESOURCE_EXHAUSTED
    // instead of growing the process without bound.
    grpc::ResourceQuota quota("lazykv-server");
    quota.SetMaxThreads(options.max_threads);
    builder.SetResourceQuota(quota);
  }
  // LAZYKV_GRPC_SYNC_CQS=N: the sync server's completion queues where the options leave them
  // (gRPC's default is one a core, each polled by its own threads), for measurements of the
  // served path's hops on many-core hosts (bench/grpc_stream_bench --sync-cqs sets the option).
  static const int env_sync_cqs = EnvCount("LAZYKV_GRPC_SYNC_CQS");
  const int sync_cqs = options.sync_cqs > 0 ? options.sync_cqs : env_sync_cqs;
  if (sync_cqs > 0) builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::NUM_CQS, sync_cqs);
  // A second server on a busy port must fail, not silently share its connections.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, options.keepalive_time_ms);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, options.keepalive_timeout_ms);
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, options.handshake_timeout_ms);
  if (options.max_connection_idle_ms > 0) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, options.max_connection_idle_ms);
  }
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || *port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.listen));
  }
  server->GetHealthCheckService()->SetServingStatus(true);  // "" and every named service
  if (!options.service_name.empty()) server->GetHealthCheckService()->SetServingStatus(options.service_name, true);
  return server;
}

}  // namespace lazykv
