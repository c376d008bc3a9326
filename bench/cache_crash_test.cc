// lazykv-cache-crash-test: kills the real lazykv-cache-server under load, again and again,
// and checks every restart against the history of what it acknowledged (issue 21,
// "Durability under stress"; in the spirit of RocksDB's db_crashtest and Jepsen histories).
//
// Each cycle starts the server on the same data directory (a small host tier and disk cap,
// so that eviction, demotion and promotion happen), checks the restarted server, runs the
// load (bench/cache_crash_load.h) and ends the server with SIGKILL at a random time, or
// lets an armed crash point (common/crash_point.h) kill it first. After the cycles, a last
// server is stopped with SIGTERM and must keep everything it acknowledged.
//
// After every restart, with the load stopped (bench/cache_crash_model.h for the model):
// - every key ever used is looked up; the keys the server reports present must be exactly
//   what its Stats count: host RAM empty, the disk tier's used bytes and entries equal to
//   the sum of their sizes and their number, each in the disk tier with its exact size;
// - required keys (acknowledged at least --durable-after-ms before the kill, or present at
//   the previous restart, and not deleted since) are present, or evicted as the LRU bound
//   allows; a missing one beyond the bound is LOST; a deleted key must stay deleted;
// - the data directory's bytes (du -sb: every file's size) are recorded against the disk
//   cap, and must stay under --du-bound times the cap plus --du-slack.
// Prints a summary of violations and exits 1 on any (2: the test could not run).
#include <arpa/inet.h>
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <regex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "bench/cache_crash_load.h"
#include "common/byte_size.h"
#include "common/child_process.h"
#include "common/flag_parser.h"
#include "common/grpc_util.h"
#include "common/splitmix64.h"
#include "common/status_macros.h"
#include "proto/kvcache.grpc.pb.h"

namespace lazykv::crash {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr char kUsage[] = R"(usage: lazykv-cache-crash-test [options]
  --cycles N                kill-restart cycles (default 20)
  --seconds-per-cycle S     load per cycle before the kill at the latest (default 2)
  --seed N                  run seed (default: from the clock; printed)
  --dir DIR                 data directory, wiped first (default: a fresh one under /tmp)
  --server-binary PATH      lazykv-cache-server (default: the one built beside this test)
  --host-capacity BYTES     server's host tier (default 16MiB)
  --disk-capacity BYTES     server's disk cap (default 128MiB)
  --page-size BYTES         server's host page (default 64KiB)
  --threads N               load threads (default 4)
  --ops-per-second N        calls per second, all threads (default 400)
  --put-mbps N              MB/s put, all threads (default 16)
  --crash-point-fraction F  share of cycles that arm one crash point, in turn (default 0.5)
  --crash-probability P     per pass through the armed point (default 0.01)
  --durable-after-ms N      an acknowledged put must survive a kill this much later (default 2000)
  --du-bound X              fail when the directory exceeds X times the disk cap ... (default 4)
  --du-slack BYTES          ... plus this (default 64MiB)
  --between-cycles CMD      run `CMD DIR/db` after each kill, before the restart (an offline check of
                            the RocksDB directory, say); a nonzero exit is a violation
  --keep                    keep the data directory after a clean run
)";

// Every crash point in cache_server/ (tiered_store.cc, disk_tier.cc).
const std::vector<std::string> kCrashPoints = {"disk.after_write_before_index",    "disk.evict_after_unindex",
                                               "host.evict_after_choose",          "host.demote_before_enqueue",
                                               "host.commit_before_write_through", "host.promote_before_insert",
                                               "writer.before_disk_put",           "writer.after_disk_put"};

struct Flags {
  int cycles = 20;
  double seconds_per_cycle = 2;
  uint64_t seed = 0;
  std::string dir;
  std::string server_binary = LAZYKV_CACHE_SERVER;
  uint64_t host_capacity = 16 << 20, disk_capacity = 128 << 20, page_size = 64 << 10;
  LoadOptions load;
  double crash_point_fraction = 0.5;
  double crash_probability = 0.01;
  int durable_after_ms = 2000;
  double du_bound = 4;
  uint64_t du_slack = 64 << 20;
  std::string between_cycles;
  bool keep = false;
};

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

std::string DescribeExit(int status) {
  if (WIFSIGNALED(status)) return absl::StrFormat("killed by signal %d", WTERMSIG(status));
  return absl::StrFormat("exit %d", WEXITSTATUS(status));
}

// The server as a child process (common/child_process.h's SpawnServer) with the crash
// points in its environment, a non-blocking check for its death and a bounded stop.
// Not thread-safe: the driver thread owns it.
class ServerChild {
 public:
  // `env` arms the crash points; crash-point variables of the driver's own environment are
  // not passed on.
  ServerChild(const std::string& binary, std::vector<std::string> args, std::vector<std::string> env,
              const std::string& log_path) {
    for (const char* name : {"LAZYKV_CRASH_POINTS", "LAZYKV_CRASH_PROBABILITY"}) {
      if (std::none_of(env.begin(), env.end(), [&](const std::string& e) { return e.starts_with(name); })) {
        env.emplace_back(name);
      }
    }
    SpawnedServer spawned = SpawnServer(binary, std::move(args), log_path, env);
    pid_ = spawned.pid;
    address_ = AddressAfter(spawned.first_line, "listening on");
  }
  ~ServerChild() {
    if (pid_ > 0) Stop(SIGKILL, std::chrono::seconds(10));
  }

  const std::string& address() const { return address_; }
  // The wait status once it has exited (reaped now), else nothing.
  std::optional<int> Poll() {
    int status = 0;
    if (pid_ > 0 && waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      exit_status_ = status;
    }
    return exit_status_;
  }
  // Sends `signal` and waits up to `wait` for the exit (then SIGKILL); returns the wait status.
  int Stop(int signal, std::chrono::milliseconds wait) {
    if (pid_ > 0) kill(pid_, signal);
    const auto deadline = Clock::now() + wait;
    while (!Poll()) {
      if (Clock::now() > deadline) {
        kill(pid_, SIGKILL);
        timed_out_ = true;
        int status = 0;
        waitpid(pid_, &status, 0);
        pid_ = -1;
        exit_status_ = status;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return *exit_status_;
  }
  bool timed_out() const { return timed_out_; }

 private:
  pid_t pid_ = -1;
  std::string address_;
  std::optional<int> exit_status_;
  bool timed_out_ = false;
};

int FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

// What `du -sb` counts of the files: every regular file's size.
uint64_t DirectoryBytes(const std::string& dir) {
  uint64_t total = 0;
  std::error_code error;
  for (const auto& entry : fs::recursive_directory_iterator(dir, error)) {
    if (entry.is_regular_file(error)) total += entry.file_size(error);
  }
  return total;
}

// The crash point lines the server wrote to its log since `*offset`.
std::vector<std::pair<std::string, int64_t>> CrashPointLines(const std::string& log_path, uint64_t* offset,
                                                             std::string* tail) {
  std::ifstream in(log_path, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(*offset));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  *offset += text.size();
  *tail = text.size() > 600 ? text.substr(text.size() - 600) : text;
  std::vector<std::pair<std::string, int64_t>> fired;
  const std::regex line(R"(lazykv crash point (\S+) fired at (\d+))");
  for (std::sregex_iterator it(text.begin(), text.end(), line), end; it != end; ++it) {
    fired.emplace_back((*it)[1], std::stoll((*it)[2]));
  }
  return fired;
}

struct Totals {
  RestartCheck checks;
  int restarts = 0;
  std::map<std::string, int> deaths;  // cause -> count
  std::map<std::string, int> armed;   // crash point -> cycles armed
  std::vector<double> du_ratios;
  uint64_t max_pending = 0, disk_evictions = 0, host_evictions = 0, demotions = 0, promotions = 0;
};

class Driver {
 public:
  explicit Driver(const Flags& flags)
      : flags_(flags), checker_(flags.seed, flags.host_capacity, flags.disk_capacity), port_(FreeLoopbackPort()) {}

  int Run();

 private:
  std::unique_ptr<ServerChild> Start(const std::vector<std::string>& env);
  bool CheckRestart(const std::string& address, const std::string& label);
  // Runs the load on `server` until it dies, or until `kill_at` (then SIGKILL).
  void RunCycle(ServerChild& server, const std::string& armed, Clock::time_point kill_at);
  void Observe(const ServerObservations& seen);
  void PrintSummary();

  const Flags flags_;
  History history_;
  DurabilityChecker checker_;
  std::vector<Incarnation> incarnations_;
  std::atomic<int64_t> next_id_{0};
  Totals totals_;
  int port_;
  uint64_t log_offset_ = 0;
};

std::unique_ptr<ServerChild> Driver::Start(const std::vector<std::string>& env) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    auto server = std::make_unique<ServerChild>(
        flags_.server_binary,
        std::vector<std::string>{"--listen", absl::StrCat("127.0.0.1:", port_), "--data-dir", flags_.dir + "/db",
                                 "--host-capacity", absl::StrCat(flags_.host_capacity), "--disk-capacity",
                                 absl::StrCat(flags_.disk_capacity), "--page-size", absl::StrCat(flags_.page_size),
                                 "--no-pin", "--shutdown-grace-ms", "3000", "--stream-idle-timeout-ms", "5000"},
        env, flags_.dir + "/server.log");
    if (!server->address().empty()) return server;
    server->Stop(SIGKILL, std::chrono::seconds(5));
    port_ = FreeLoopbackPort();  // taken meanwhile: move on
  }
  return nullptr;
}

bool Driver::CheckRestart(const std::string& address, const std::string& label) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  auto stub = v1::KvCache::NewStub(grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
  std::unordered_map<int64_t, FoundKey> found;
  const int64_t ids = next_id_.load();
  for (int64_t first = 0; first < ids; first += 4096) {
    v1::LookupRequest request;
    const int64_t last = std::min(ids, first + 4096);
    for (int64_t id = first; id < last; ++id) *request.add_keys() = ToProto(KeyOf(flags_.seed, id));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    v1::LookupResponse response;
    const grpc::Status status = stub->Lookup(&context, request, &response);
    if (!status.ok() || response.results_size() != last - first) {
      history_.AddViolation("restart_check_failed", absl::StrFormat("%s: lookup: %s", label, status.error_message()));
      return false;
    }
    for (int64_t id = first; id < last; ++id) {
      const v1::LookupResult& r = response.results(static_cast<int>(id - first));
      if (r.found()) found[id] = FoundKey{r.stored_bytes(), r.tier()};
    }
  }
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::StatsResponse stats;
  if (const grpc::Status s = stub->Stats(&context, v1::StatsRequest(), &stats); !s.ok()) {
    history_.AddViolation("restart_check_failed", absl::StrFormat("%s: stats: %s", label, s.error_message()));
    return false;
  }
  uint64_t sum = 0;
  for (const auto& [id, where] : found) {
    sum += where.bytes;
    if (where.bytes != checker_.SizeOf(id) || where.tier != v1::TIER_DISK) {
      history_.AddViolation("restart_wrong_key",
                            absl::StrFormat("%s: key %d present with %d bytes in tier %d; the "
                                            "chunk has %d bytes and a new server only has disk",
                                            label, id, where.bytes, where.tier, checker_.SizeOf(id)));
    }
  }
  for (const v1::TierStats& tier : stats.tiers()) {
    const bool disk = tier.tier() == v1::TIER_DISK;
    const uint64_t want_bytes = disk ? sum : 0, want_entries = disk ? found.size() : 0;
    if (tier.used_bytes() != want_bytes || tier.entries() != want_entries) {
      history_.AddViolation(
          "occupancy_mismatch",
          absl::StrFormat("%s: %s tier counts %d bytes in %d entries; lookups find %d in %d", label,
                          disk ? "disk" : "host", tier.used_bytes(), tier.entries(), want_bytes, want_entries));
    }
  }
  const uint64_t du = DirectoryBytes(flags_.dir + "/db");
  const double ratio = static_cast<double>(du) / static_cast<double>(flags_.disk_capacity);
  totals_.du_ratios.push_back(ratio);
  if (du > flags_.du_bound * static_cast<double>(flags_.disk_capacity) + static_cast<double>(flags_.du_slack)) {
    history_.AddViolation("disk_over_bound",
                          absl::StrFormat("%s: directory %s, %.2fx the cap %s", label, FormatByteSize(du), ratio,
                                          FormatByteSize(flags_.disk_capacity)));
  }
  const RestartCheck c = checker_.Check(history_.Calls(), incarnations_, found, NowNs(), history_);
  totals_.checks.required += c.required;
  totals_.checks.required_present += c.required_present;
  totals_.checks.evicted += c.evicted;
  totals_.checks.lost += c.lost;
  totals_.checks.resurrected += c.resurrected;
  totals_.checks.keys_present = c.keys_present;
  totals_.checks.bytes_present = c.bytes_present;
  ++totals_.restarts;
  std::cout << absl::StrFormat(
      "%s: %d keys (%s) on disk, dir %.2fx the cap; required %d: present %d, evicted %d, lost %d; resurrected %d\n",
      label, c.keys_present, FormatByteSize(c.bytes_present), ratio, c.required, c.required_present, c.evicted, c.lost,
      c.resurrected);
  return true;
}

void Driver::Observe(const ServerObservations& seen) {
  totals_.max_pending = std::max(totals_.max_pending, seen.max_pending_disk_writes.load());
  totals_.disk_evictions += seen.disk_evictions.load();
  totals_.host_evictions += seen.host_evictions.load();
  totals_.demotions += seen.demotions.load();
  totals_.promotions += seen.promotions.load();
}

void Driver::RunCycle(ServerChild& server, const std::string& armed, Clock::time_point kill_at) {
  const int incarnation = static_cast<int>(incarnations_.size());
  Incarnation self{.start_ns = NowNs(), .grace_ns = int64_t{flags_.durable_after_ms} * 1'000'000, .cause = ""};
  ServerObservations seen;
  {
    Load load(flags_.load, incarnation, server.address(), &next_id_, &history_, &seen);
    while (!server.Poll() && Clock::now() < kill_at) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    if (!server.Poll()) {
      self.death_ns = NowNs();  // before the signal: a lower bound
      self.cause = "kill";
      server.Stop(SIGKILL, std::chrono::seconds(10));
    }
    load.Stop();
  }  // joined: every call has ended
  std::string tail;
  const auto fired = CrashPointLines(flags_.dir + "/server.log", &log_offset_, &tail);
  if (self.cause.empty()) {
    if (!fired.empty()) {
      self.cause = "crash point " + fired.back().first;
      self.death_ns = fired.back().second;
    } else {
      self.cause = "crashed";
      history_.AddViolation("server_crashed",
                            absl::StrFormat("incarnation %d: %s (armed: %s); log ends: %s", incarnation,
                                            DescribeExit(*server.Poll()), armed.empty() ? "none" : armed, tail));
      self.death_ns = self.start_ns;  // the last answer it gave would be later: stay safe
      for (const CallRecord& c : history_.Calls()) {
        if (c.incarnation == incarnation && c.code == 0) self.death_ns = std::max(self.death_ns, c.end_ns);
      }
    }
  }
  ++totals_.deaths[self.cause];
  Observe(seen);
  incarnations_.push_back(self);
}

int Driver::Run() {
  std::cout << absl::StrFormat(
      "lazykv-cache-crash-test: seed %d, %d cycles of up to %.1f s, dir %s, host %s, disk cap %s, grace %d ms\n",
      flags_.seed, flags_.cycles, flags_.seconds_per_cycle, flags_.dir, FormatByteSize(flags_.host_capacity),
      FormatByteSize(flags_.disk_capacity), flags_.durable_after_ms);
  uint64_t rng = flags_.seed;
  size_t next_point = SplitMix64(rng) % kCrashPoints.size();
  const auto cycle_length = std::chrono::duration<double>(flags_.seconds_per_cycle);
  for (int cycle = 0; cycle < flags_.cycles; ++cycle) {
    std::string armed;
    std::vector<std::string> env;
    if (SplitMix64Unit(rng) < flags_.crash_point_fraction) {
      armed = kCrashPoints[next_point++ % kCrashPoints.size()];
      env = {"LAZYKV_CRASH_POINTS=" + armed, absl::StrCat("LAZYKV_CRASH_PROBABILITY=", flags_.crash_probability)};
      ++totals_.armed[armed];
    }
    auto server = Start(env);
    if (server == nullptr) {
      std::cerr << "cycle " << cycle << ": the server did not start; see " << flags_.dir << "/server.log\n";
      return 2;
    }
    if (!CheckRestart(server->address(), absl::StrFormat("cycle %d start", cycle))) return 2;
    // Unarmed: SIGKILL at a random time; armed: the point kills it, or SIGKILL at the end.
    const double fraction = armed.empty() ? 0.2 + 0.8 * SplitMix64Unit(rng) : 1.0;
    const auto kill_at = Clock::now() + std::chrono::duration_cast<Clock::duration>(cycle_length * fraction);
    RunCycle(*server, armed, kill_at);
    if (!flags_.between_cycles.empty()) {
      const int status = std::system(absl::StrCat(flags_.between_cycles, " ", flags_.dir, "/db").c_str());
      if (status != 0) {
        history_.AddViolation("between_cycles",
                              absl::StrFormat("cycle %d: `%s` exited with %d (after %s)", cycle, flags_.between_cycles,
                                              status, incarnations_.back().cause));
      }
    }
    std::cout << absl::StrFormat("cycle %d: %s after %.2f s%s\n", cycle, incarnations_.back().cause,
                                 (incarnations_.back().death_ns - incarnations_.back().start_ns) / 1e9,
                                 armed.empty() ? "" : " (armed: " + armed + ")");
  }
  // A clean stop keeps everything acknowledged (grace 0), checked by one more restart.
  auto server = Start({});
  if (server == nullptr || !CheckRestart(server->address(), "final start")) return 2;
  {
    const int incarnation = static_cast<int>(incarnations_.size());
    ServerObservations seen;
    Load load(flags_.load, incarnation, server->address(), &next_id_, &history_, &seen);
    std::this_thread::sleep_for(cycle_length);
    const int status = server->Stop(SIGTERM, std::chrono::seconds(15));  // under load: it drains
    const int64_t stopped = NowNs();
    load.Stop();
    if (server->timed_out() || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      history_.AddViolation("unclean_shutdown", absl::StrFormat("SIGTERM under load: %s%s", DescribeExit(status),
                                                                server->timed_out() ? " (after 15 s)" : ""));
    }
    Observe(seen);
    incarnations_.push_back(Incarnation{.start_ns = stopped, .death_ns = stopped, .grace_ns = 0, .cause = "sigterm"});
    ++totals_.deaths["sigterm"];
  }
  server = Start({});
  if (server == nullptr || !CheckRestart(server->address(), "after SIGTERM")) return 2;
  server->Stop(SIGTERM, std::chrono::seconds(15));
  PrintSummary();
  return history_.violation_count() == 0 ? 0 : 1;
}

void Driver::PrintSummary() {
  const std::vector<CallRecord> calls = history_.Calls();
  std::map<std::string, std::map<int, uint64_t>> codes;
  for (const CallRecord& c : calls) ++codes[OpName(c.op)][c.code];
  std::cout << absl::StrFormat("\nsummary (seed %d): %d calls\n", flags_.seed, calls.size());
  for (const auto& [op, by_code] : codes) {
    std::vector<std::string> parts;
    for (const auto& [code, n] : by_code) parts.push_back(absl::StrFormat("code %d: %d", code, n));
    std::cout << absl::StrFormat("  %-7s %s\n", op, absl::StrJoin(parts, ", "));
  }
  std::vector<std::string> deaths, armed;
  for (const auto& [cause, n] : totals_.deaths) deaths.push_back(absl::StrFormat("%s %d", cause, n));
  for (const auto& [point, n] : totals_.armed) armed.push_back(absl::StrFormat("%s %d", point, n));
  std::cout << "  ends: " << absl::StrJoin(deaths, ", ") << "\n";
  std::cout << "  cycles armed per crash point: " << (armed.empty() ? "none" : absl::StrJoin(armed, ", ")) << "\n";
  const RestartCheck& c = totals_.checks;
  std::cout << absl::StrFormat(
      "  restarts checked %d; required keys (summed over checks) %d: present %d, evicted %d, lost %d; resurrected %d\n",
      totals_.restarts, c.required, c.required_present, c.evicted, c.lost, c.resurrected);
  std::vector<double> ratios = totals_.du_ratios;
  std::sort(ratios.begin(), ratios.end());
  if (!ratios.empty()) {
    std::cout << absl::StrFormat("  dir / disk cap at restarts: min %.2f, median %.2f, max %.2f, last %.2f\n",
                                 ratios.front(), ratios[ratios.size() / 2], ratios.back(), totals_.du_ratios.back());
  }
  std::cout << absl::StrFormat(
      "  server stats seen: max pending disk writes %d; evictions host %d disk %d; demotions %d, promotions %d\n",
      totals_.max_pending, totals_.host_evictions, totals_.disk_evictions, totals_.demotions, totals_.promotions);
  const auto violations = history_.Violations();
  std::cout << absl::StrFormat("violations: %d\n", history_.violation_count());
  for (const auto& [category, entry] : violations) {
    std::cout << absl::StrFormat("  %s: %d\n", category, entry.first);
    for (const std::string& example : entry.second) std::cout << "    " << example << "\n";
  }
}

absl::Status ParseFlags(int argc, char** argv, Flags& f) {
  FlagParser parser(kUsage);
  parser.AddInt("--cycles", &f.cycles);
  parser.AddDouble("--seconds-per-cycle", &f.seconds_per_cycle);
  parser.AddUint64("--seed", &f.seed);
  parser.AddString("--dir", &f.dir);
  parser.AddString("--server-binary", &f.server_binary);
  parser.AddByteSize("--host-capacity", &f.host_capacity);
  parser.AddByteSize("--disk-capacity", &f.disk_capacity);
  parser.AddByteSize("--page-size", &f.page_size);
  parser.AddInt("--threads", &f.load.threads);
  parser.AddDouble("--ops-per-second", &f.load.ops_per_second);
  parser.AddDouble("--put-mbps", &f.load.put_mbps);
  parser.AddDouble("--crash-point-fraction", &f.crash_point_fraction);
  parser.AddDouble("--crash-probability", &f.crash_probability);
  parser.AddInt("--durable-after-ms", &f.durable_after_ms);
  parser.AddDouble("--du-bound", &f.du_bound);
  parser.AddByteSize("--du-slack", &f.du_slack);
  parser.AddString("--between-cycles", &f.between_cycles);
  parser.AddSwitch("--keep", &f.keep);
  RETURN_IF_ERROR(parser.Parse(argc, argv));
  if (f.cycles < 1 || f.seconds_per_cycle <= 0)
    return absl::InvalidArgumentError("--cycles and --seconds-per-cycle must be positive");
  if (f.load.threads < 1 || f.load.ops_per_second <= 0 || f.load.put_mbps <= 0) {
    return absl::InvalidArgumentError("--threads, --ops-per-second and --put-mbps must be positive");
  }
  if (f.seed == 0) f.seed = static_cast<uint64_t>(NowNs()) % 1000000007;
  f.load.seed = f.seed;
  if (f.dir.empty()) f.dir = (fs::temp_directory_path() / absl::StrCat("lazykv_cache_crash_", f.seed)).string();
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  Flags flags;
  if (absl::Status s = ParseFlags(argc, argv, flags); !s.ok()) return ExitForFlagError(s, "lazykv-cache-crash-test");
  signal(SIGPIPE, SIG_IGN);
  std::error_code error;
  fs::remove_all(flags.dir, error);
  fs::create_directories(flags.dir, error);
  if (error) {
    std::cerr << "cannot create " << flags.dir << ": " << error.message() << "\n";
    return 2;
  }
  const int result = Driver(flags).Run();
  if (result == 0 && !flags.keep) fs::remove_all(flags.dir, error);
  if (result != 0) std::cout << "data directory and server log kept in " << flags.dir << "\n";
  return result;
}

}  // namespace
}  // namespace lazykv::crash

int main(int argc, char** argv) { return lazykv::crash::Main(argc, argv); }
