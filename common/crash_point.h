// Named crash points for crash testing (bench/cache_crash_test.cc, in the spirit of
// RocksDB's db_crashtest): `LAZYKV_CRASH_POINT("disk.after_write_before_index")` marks a
// place where a process killed by the kernel would leave a state worth checking.
//
// Inert unless the process was started with the environment variables
//   LAZYKV_CRASH_POINTS=name1,name2   (or "*": every point)
//   LAZYKV_CRASH_PROBABILITY=0.02     (per pass through an armed point; default 0.01)
// then each pass through an armed point kills the process with SIGKILL with that
// probability, after writing one line to stderr:
//   lazykv crash point NAME fired at MONOTONIC_NS
// (CLOCK_MONOTONIC, the clock of std::chrono::steady_clock, shared by every process on the
// host, so a test can tell exactly when its server died).
//
// Cost when not armed: one relaxed atomic load and a branch. The environment is read once,
// before main (a static initializer of crash_point.cc).
//
// Thread-safe: points may be passed on any thread; the armed set never changes after start.
#pragma once

#include <atomic>
#include <string>
#include <vector>

namespace lazykv::crash_point {

// True when LAZYKV_CRASH_POINTS named at least one point (set before main, then constant).
extern std::atomic<bool> g_armed;

// The slow path: kills the process (SIGKILL) with the configured probability if `name` is
// armed. Call through LAZYKV_CRASH_POINT.
void MaybeCrash(const char* name);

// The armed names (empty when inert) and the probability, for a startup log line.
std::vector<std::string> ArmedNames();
double Probability();

}  // namespace lazykv::crash_point

#define LAZYKV_CRASH_POINT(name)                                                     \
  do {                                                                               \
    if (::lazykv::crash_point::g_armed.load(std::memory_order_relaxed)) [[unlikely]] \
      ::lazykv::crash_point::MaybeCrash(name);                                       \
  } while (0)
