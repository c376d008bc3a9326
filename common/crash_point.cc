#include "common/crash_point.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/splitmix64.h"

namespace lazykv::crash_point {

std::atomic<bool> g_armed{false};

namespace {

struct Config {
  bool all = false;
  std::vector<std::string> names;
  double probability = 0.01;
};

// Written once by the initializer below, before main; read-only afterwards.
Config& config() {
  static Config* c = new Config();
  return *c;
}

bool ReadEnvironment() {
  const char* points = std::getenv("LAZYKV_CRASH_POINTS");
  if (points == nullptr || *points == '\0') return false;
  Config& c = config();
  for (absl::string_view name : absl::StrSplit(points, ',', absl::SkipWhitespace())) {
    if (name == "*") c.all = true;
    c.names.emplace_back(name);
  }
  if (const char* p = std::getenv("LAZYKV_CRASH_PROBABILITY"); p != nullptr) {
    double value = 0;
    if (absl::SimpleAtod(p, &value) && value >= 0 && value <= 1) c.probability = value;
  }
  g_armed.store(!c.names.empty(), std::memory_order_relaxed);
  return true;
}

const bool g_read_environment = ReadEnvironment();

bool Armed(const char* name) {
  const Config& c = config();
  if (c.all) return true;
  for (const std::string& armed : c.names) {
    if (armed == name) return true;
  }
  return false;
}

double NextUnit() {
  thread_local uint64_t state = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
                                (std::hash<std::thread::id>()(std::this_thread::get_id()) * 0x9e3779b97f4a7c15ULL) ^
                                static_cast<uint64_t>(getpid());
  return SplitMix64Unit(state);
}

}  // namespace

void MaybeCrash(const char* name) {
  (void)g_read_environment;
  if (!Armed(name) || NextUnit() >= config().probability) return;
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  char line[256];
  const int n = std::snprintf(line, sizeof(line), "lazykv crash point %s fired at %lld\n", name,
                              static_cast<long long>(now.tv_sec) * 1000000000LL + now.tv_nsec);
  if (n > 0) (void)!write(STDERR_FILENO, line, std::min<size_t>(static_cast<size_t>(n), sizeof(line) - 1));
  kill(getpid(), SIGKILL);
  while (true) pause();  // the signal ends the process before this returns
}

std::vector<std::string> ArmedNames() { return config().names; }

double Probability() { return config().probability; }

}  // namespace lazykv::crash_point
