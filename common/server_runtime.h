// What every LazyKV server process does around its service: termination signals taken
// by one thread, the Prometheus endpoint, and the "listening on" line that tests and
// scripts wait for.
#pragma once

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

// "NAME listening on HOST:PORT[ metrics on HOST:PORT]" on stdout (common/child_process.h
// parses it).
void PrintListening(const std::string& name, const std::string& listen, int port, const prometheus::Exposer* exposer,
                    const std::string& metrics_listen);

}  // namespace lazykv
