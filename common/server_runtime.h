// What every LazyKV server process does around its service: termination signals taken
// by one thread, the gRPC server, and the "listening on" line that tests and scripts
// wait for. The /metrics endpoint is common/metrics_server.h.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/metrics_server.h"
#include "common/security/call_authorizer.h"
#include "common/security/transport_security.h"

namespace lazykv {

// Blocks SIGTERM and SIGINT in this thread and every thread started after it, so that
// WaitForTerminationSignal() takes them instead of whichever thread they would hit; and
// ignores SIGPIPE (a peer gone mid-write is that connection's error, not the process's).
void BlockTerminationSignals();
int WaitForTerminationSignal();  // the signal's number

struct GrpcServerOptions {
  std::string listen;        // HOST:PORT; port 0 picks one
  std::string service_name;  // its health status is reported under this name too (e.g. "lazykv.v1.KvCache")
  std::shared_ptr<grpc::ServerCredentials> credentials;  // null: plaintext
  size_t max_message_bytes = 16 << 20;                   // both ways
  int stream_window_bytes = 0;  // per-stream flow-control window when above 0 (MiB-sized messages)
  int max_threads = 0;          // gRPC resource quota on handler threads; 0: gRPC's default
  // HTTP/2 keepalive: a ping after this long without traffic, and the connection closed
  // when its answer does not come within the timeout (a peer that died or froze).
  int keepalive_time_ms = 30000;
  int keepalive_timeout_ms = 10000;
  // A connection that has not finished its HTTP/2 (and TLS) handshake this long after it was
  // accepted is closed: idle sockets opened and left silent must not pile up towards the
  // process's descriptor limit (gRPC's default waits 120 s).
  int handshake_timeout_ms = 10000;
  // A connection with no call for this long is sent GOAWAY (clients reconnect when they next
  // call); 0: never.
  int max_connection_idle_ms = 10 * 60 * 1000;
  // The sync server's completion queues; 0: LAZYKV_GRPC_SYNC_CQS, else gRPC's default (one a
  // core, each polled by its own threads).
  int sync_cqs = 0;
};

// Builds and starts a gRPC server for `service`: the standard health service serving
// (it needs no token: probes and load balancers call it), keepalives that notice dead
// peers on idle streams, handshake and idle-connection timeouts, and the options' limits.
// The process's soft limit on open descriptors is raised to its hard limit first (once):
// gRPC 1.51's listener stops accepting for good after an accept fails with EMFILE. *port receives the bound port;
// UNAVAILABLE when nothing could be bound.
absl::StatusOr<std::unique_ptr<grpc::Server>> StartGrpcServer(const GrpcServerOptions& options, grpc::Service* service,
                                                              int* port);

// "NAME listening on HOST:PORT[ metrics on HOST:PORT][ http on HOST:PORT]" on stdout
// (common/child_process.h parses it). `http_port` 0: no HTTP API.
void PrintListening(const std::string& name, const std::string& listen, int port, const MetricsServer* metrics,
                    const std::string& metrics_listen, const std::string& http_listen = "", int http_port = 0);

}  // namespace lazykv
