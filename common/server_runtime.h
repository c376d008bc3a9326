// What every LazyKV server process does around its service: termination signals taken
// by one thread, the Prometheus endpoint, and the "listening on" line that tests and
// scripts wait for.
#pragma once

#include <grpcpp/grpcpp.h>
#include <prometheus/exposer.h>
#include <prometheus/registry.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace lazykv {

// Blocks SIGTERM and SIGINT in this thread and every thread started after it, so that
// WaitForTerminationSignal() takes them instead of whichever thread they would hit.
void BlockTerminationSignals();
int WaitForTerminationSignal();  // the signal's number

// /metrics on `address` (HOST:PORT, port 0 picks one); null when `address` is empty.
absl::StatusOr<std::unique_ptr<prometheus::Exposer>> StartMetricsExposer(
    const std::string& address, const std::shared_ptr<prometheus::Registry>& registry);

// Builds and starts a gRPC server for `service` on `listen` (HOST:PORT, port 0 picks one):
// the standard health service serving, messages capped at `max_message_bytes` both ways,
// keepalives that notice dead peers on idle streams, and a per-stream flow-control window
// of `stream_window_bytes` where it is above 0 (for MiB-sized messages). *port receives
// the bound port; UNAVAILABLE when nothing could be bound.
absl::StatusOr<std::unique_ptr<grpc::Server>> StartGrpcServer(const std::string& listen, grpc::Service* service,
                                                              size_t max_message_bytes, int stream_window_bytes,
                                                              int* port);

// "NAME listening on HOST:PORT[ metrics on HOST:PORT]" on stdout (common/child_process.h
// parses it).
void PrintListening(const std::string& name, const std::string& listen, int port, const prometheus::Exposer* exposer,
                    const std::string& metrics_listen);

}  // namespace lazykv
