// A timeline of the GPU work (kernels, copies, memsets) this process runs between Start and
// Stop, from CUPTI's activity API: where a step's time goes, on machines with no profiler
// installed. CUPTI is loaded at run time ($LAZYKV_CUPTI, else libcupti.so.13 on the library
// path), so the benchmarks link and run without it; Start then fails with UNAVAILABLE.
//
// One trace at a time per process (CUPTI's activity buffers are process-wide). Not thread
// safe: Start and Stop from one thread; the GPU work traced may come from any.
#pragma once

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/trace_summary.h"

namespace lazykv::bench {

class KernelTrace {
 public:
  static absl::StatusOr<std::unique_ptr<KernelTrace>> Start();
  ~KernelTrace();  // stops a trace still running
  // Waits for the device, flushes CUPTI's buffers and stops: the records since Start, by start.
  std::vector<TraceRecord> Stop();

 private:
  KernelTrace() = default;
  bool running_ = false;
};

}  // namespace lazykv::bench
