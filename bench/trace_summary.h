// A GPU timeline's records summed up: where a step's time goes (bench/kernel_trace.h makes
// the records). Plain C++, tested on the CPU.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace lazykv::bench {

struct TraceRecord {
  std::string name;  // the kernel's demangled name without its parameters; "memcpy", "memset"
  uint64_t start_ns = 0, end_ns = 0;
};

struct TraceTotals {
  uint64_t span_ns = 0;  // from the first record's start to the last end
  uint64_t busy_ns = 0;  // the union of the records' intervals: some work running
};

// "void ns::(anonymous namespace)::Kernel<int, 4>(Params, int)" -> "Kernel<int, 4>": a
// demangled kernel name without its return type, namespaces and parameters, at most 60
// characters.
std::string ShortKernelName(std::string demangled);

// Records in any order; one with end_ns < start_ns counts as empty.
TraceTotals TotalTrace(const std::vector<TraceRecord>& records);

// Per name, how much later the work so far ends because of its records, taken in order of
// start (a record adds the part of it past every earlier record's end; an incomplete one adds
// nothing). The values add up to TotalTrace's busy_ns.
std::map<std::string, uint64_t> AddedTime(const std::vector<TraceRecord>& records);

// Per name: calls and time per step (steps: how many the trace covered), sorted by time; then
// the span per step, the time some work ran and the gaps (span minus that), as a table. A
// kernel's time runs from its first CTA's start: with dependent launches
// (kernels/cuda/dependent_launch.cuh) that includes its wait for the kernel before it, so
// per-kernel times overlap and their shares can add up past 100% (the union, "some work
// running", does not double count). "adds us" is AddedTime per step: with one stream of
// dependent launches, how much each kernel lengthens the step, its wait for the kernel before
// it left out.
std::string SummarizeTrace(const std::vector<TraceRecord>& records, int steps);

}  // namespace lazykv::bench
