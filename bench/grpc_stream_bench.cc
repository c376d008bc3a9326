// What gRPC's two server APIs cost a streamed reply's first token on this host: the worker's
// Generate shape (a request of a few thousand token ids, a separate "engine" thread that
// produces the tokens, a server-streaming reply) served once by a sync handler (a handler
// thread waiting on the request's queue and blocking in Write, as worker/serve does) and once
// by a callback reactor (the engine thread starting the write itself), alternated over
// loopback in one process. No model: the engine emits its first token a fixed time after the
// request reaches it, then the rest at a fixed interval, so every difference is the API's.
//
// Per request it stamps the client's send, the handler's (or reactor's) first line, the
// engine's emit of the first token and the client's first read (one steady clock), and
// reports per API the medians and quartiles of: inbound (send to first line), outbound
// (emit to first read) and their sum, the transit.
//
//   grpc_stream_bench [--requests N] [--tokens N] [--prompt-tokens N] [--first-token-us N]
//                     [--token-interval-us N] [--sync-cqs N]
// --sync-cqs sets the sync server's completion queues (gRPC's default: one a core, each with
// its own pollers), which may cost hand-offs on a many-core host. A third server, "worker",
// runs the same sync handler but is started as lazykv-worker starts its own
// (common/server_runtime.h: health service, keepalives, connection timeouts, a resource quota of
// the worker's default --max-threads), so a gap between the bench and the served path's
// transit can be told apart from the server's configuration.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bench/load_stats.h"
#include "common/flag_parser.h"
#include "common/monotonic_clock.h"
#include "common/server_runtime.h"
#include "proto/generate.grpc.pb.h"

namespace lazykv {
namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  int requests = 200;
  int tokens = 4;
  int prompt_tokens = 4096;
  int first_token_us = 2000;
  int token_interval_us = 1000;
  int sync_cqs = 0;  // the sync server's completion queues (0: gRPC's default, one a core)
};

// One request's stamps (MonotonicNanos).
struct Stamps {
  std::atomic<int64_t> first_line{0}, first_emit{0};
};

// The stand-in for the engine loop: one thread; each request gets its first token
// first_token_us after it arrives, then one every token_interval_us, handed to `emit`
// (index, last). Thread-safe Submit.
class FakeEngine {
 public:
  using Emit = std::function<void(int index, bool last)>;
  FakeEngine(const Options& o) : o_(o), thread_([this] { Run(); }) {}
  ~FakeEngine() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  void Submit(Stamps* stamps, Emit emit) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      inbox_.push_back(Job{stamps, std::move(emit), Clock::now()});
    }
    wake_.notify_all();
  }

 private:
  struct Job {
    Stamps* stamps;
    Emit emit;
    Clock::time_point arrived;
  };
  void Run() {
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        wake_.wait(lock, [&] { return stopping_ || !inbox_.empty(); });
        if (stopping_) return;
        job = std::move(inbox_.front());
        inbox_.pop_front();
      }
      // One request at a time (the bench runs at concurrency 1): its tokens on schedule.
      for (int i = 0; i < o_.tokens; ++i) {
        const auto due = job.arrived + std::chrono::microseconds(o_.first_token_us + i * o_.token_interval_us);
        while (Clock::now() < due) std::this_thread::sleep_until(due);
        if (i == 0) job.stamps->first_emit.store(MonotonicNanos());
        job.emit(i, i + 1 == o_.tokens);
      }
    }
  }
  const Options o_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<Job> inbox_;
  bool stopping_ = false;
  std::thread thread_;
};

v1::GenerateResponse TokenResponse(int index) {
  v1::GenerateResponse r;
  r.mutable_delta()->add_token_ids(index);
  r.mutable_delta()->set_text(" tok");
  return r;
}

// The stamps of the request in flight (the bench runs one at a time).
std::atomic<Stamps*> g_current{nullptr};

// As worker/serve/generation_service.cc: the handler thread waits on the request's queue and
// writes each token, blocking in Write.
class SyncService final : public v1::Generation::Service {
 public:
  explicit SyncService(FakeEngine* engine) : engine_(engine) {}
  grpc::Status Generate(grpc::ServerContext*, const v1::GenerateRequest*,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) override {
    Stamps* stamps = g_current.load();
    stamps->first_line.store(MonotonicNanos());
    std::mutex mu;
    std::condition_variable ready;
    std::deque<std::pair<int, bool>> tokens;
    // Notified under the lock: once the handler has the last token it returns, and these
    // locals go with it.
    engine_->Submit(stamps, [&](int index, bool last) {
      std::lock_guard<std::mutex> lock(mu);
      tokens.emplace_back(index, last);
      ready.notify_one();
    });
    for (;;) {
      std::pair<int, bool> token;
      {
        std::unique_lock<std::mutex> lock(mu);
        ready.wait(lock, [&] { return !tokens.empty(); });
        token = tokens.front();
        tokens.pop_front();
      }
      if (!writer->Write(TokenResponse(token.first))) return grpc::Status(grpc::StatusCode::CANCELLED, "gone");
      if (token.second) return grpc::Status::OK;
    }
  }

 private:
  FakeEngine* engine_;
};

// The callback API: the engine thread hands each token to the reactor, which starts a write
// at once when none is in flight (one at a time, as gRPC requires) and finishes after the last.
class StreamReactor final : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  StreamReactor(FakeEngine* engine, Stamps* stamps) {
    stamps->first_line.store(MonotonicNanos());
    engine->Submit(stamps, [this](int index, bool last) { Token(index, last); });
  }
  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mu_);
    writing_ = false;
    if (!ok) {
      failed_ = true;
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "gone"));
      return;
    }
    StartNextLocked();
  }
  void OnDone() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    done_cv_.notify_all();
  }
  // The bench waits for the reactor to be done before it deletes it (the engine may still
  // hold `this` until its last token).
  void WaitDone() {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return done_ && engine_done_; });
  }

 private:
  void Token(int index, bool last) {
    std::lock_guard<std::mutex> lock(mu_);
    if (last) engine_done_ = true;
    if (failed_) {
      if (last) done_cv_.notify_all();
      return;
    }
    pending_.emplace_back(index, last);
    StartNextLocked();
    if (last) done_cv_.notify_all();
  }
  void StartNextLocked() {
    if (writing_ || pending_.empty() || finishing_) return;
    const auto [index, last] = pending_.front();
    pending_.pop_front();
    response_ = TokenResponse(index);
    writing_ = true;
    if (last) {
      finishing_ = true;
      StartWriteAndFinish(&response_, grpc::WriteOptions(), grpc::Status::OK);
    } else {
      StartWrite(&response_);
    }
  }
  std::mutex mu_;
  std::condition_variable done_cv_;
  std::deque<std::pair<int, bool>> pending_;
  v1::GenerateResponse response_;
  bool writing_ = false, finishing_ = false, failed_ = false, done_ = false, engine_done_ = false;
};

class CallbackService final : public v1::Generation::CallbackService {
 public:
  explicit CallbackService(FakeEngine* engine) : engine_(engine) {}
  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(grpc::CallbackServerContext*,
                                                           const v1::GenerateRequest*) override {
    auto* reactor = new StreamReactor(engine_, g_current.load());
    std::lock_guard<std::mutex> lock(mu_);
    reactors_.push_back(reactor);
    return reactor;
  }
  ~CallbackService() override {
    for (StreamReactor* r : reactors_) delete r;
  }
  void Reap() {  // reactors of finished requests (run between requests)
    std::lock_guard<std::mutex> lock(mu_);
    for (StreamReactor* r : reactors_) {
      r->WaitDone();
      delete r;
    }
    reactors_.clear();
  }

 private:
  FakeEngine* engine_;
  std::mutex mu_;
  std::vector<StreamReactor*> reactors_;
};

struct Sample {
  double inbound_ms, outbound_ms;
};

std::string Quartiles(const std::vector<double>& v) {
  char buf[96];
  std::snprintf(buf, sizeof(buf), "%.3f / %.3f / %.3f", Percentile(v, 25), Percentile(v, 50), Percentile(v, 75));
  return buf;
}

int Main(int argc, char** argv) {
  Options o;
  FlagParser flags(
      "grpc_stream_bench [--requests N] [--tokens N] [--prompt-tokens N] [--first-token-us N] "
      "[--token-interval-us N] [--sync-cqs N]");
  flags.AddInt("--requests", &o.requests);
  flags.AddInt("--tokens", &o.tokens);
  flags.AddInt("--prompt-tokens", &o.prompt_tokens);
  flags.AddInt("--first-token-us", &o.first_token_us);
  flags.AddInt("--token-interval-us", &o.token_interval_us);
  flags.AddInt("--sync-cqs", &o.sync_cqs);
  if (const absl::Status parsed = flags.Parse(argc, argv); !parsed.ok()) {
    return ExitForFlagError(parsed, "grpc_stream_bench");
  }
  if (o.requests < 1 || o.tokens < 1 || o.prompt_tokens < 0 || o.first_token_us < 0 || o.token_interval_us < 0 ||
      o.sync_cqs < 0) {
    std::fprintf(stderr, "grpc_stream_bench: counts and times must be positive\n");
    return 2;
  }

  FakeEngine engine(o);
  SyncService sync_service(&engine);
  CallbackService callback_service(&engine);
  int sync_port = 0, callback_port = 0;
  grpc::ServerBuilder sync_builder, callback_builder;
  sync_builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &sync_port);
  sync_builder.RegisterService(&sync_service);
  if (o.sync_cqs > 0) sync_builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::NUM_CQS, o.sync_cqs);
  callback_builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &callback_port);
  callback_builder.RegisterService(&callback_service);
  std::unique_ptr<grpc::Server> sync_server = sync_builder.BuildAndStart();
  std::unique_ptr<grpc::Server> callback_server = callback_builder.BuildAndStart();
  if (sync_server == nullptr || callback_server == nullptr || sync_port == 0 || callback_port == 0) {
    std::fprintf(stderr, "grpc_stream_bench: cannot listen on loopback\n");
    return 1;
  }
  // Started last: StartGrpcServer also turns on gRPC's health service for the process.
  SyncService worker_service(&engine);
  int worker_port = 0;
  GrpcServerOptions worker_options;
  worker_options.listen = "127.0.0.1:0";
  worker_options.service_name = v1::Generation::service_full_name();
  worker_options.max_threads = 1024;  // lazykv-worker's --max-threads default
  worker_options.sync_cqs = o.sync_cqs;
  auto worker_server = StartGrpcServer(worker_options, &worker_service, &worker_port);
  if (!worker_server.ok()) {
    std::fprintf(stderr, "grpc_stream_bench: %s\n", std::string(worker_server.status().message()).c_str());
    return 1;
  }
  auto sync_stub = v1::Generation::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(sync_port), grpc::InsecureChannelCredentials()));
  auto worker_stub = v1::Generation::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(worker_port), grpc::InsecureChannelCredentials()));
  auto callback_stub = v1::Generation::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(callback_port), grpc::InsecureChannelCredentials()));

  v1::GenerateRequest request;
  for (int i = 0; i < o.prompt_tokens; ++i) request.mutable_prompt_tokens()->add_ids(1000 + i * 7 % 120000);
  request.mutable_sampling()->set_max_tokens(o.tokens);

  // One request through `stub`; its inbound and outbound times, or false on a failed call.
  auto one = [&](v1::Generation::Stub& stub, Sample* sample) {
    Stamps stamps;
    g_current.store(&stamps);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    const int64_t send = MonotonicNanos();
    auto reader = stub.Generate(&context, request);
    v1::GenerateResponse response;
    int64_t first_read = 0;
    int got = 0;
    while (reader->Read(&response)) {
      if (got++ == 0) first_read = MonotonicNanos();
    }
    const grpc::Status status = reader->Finish();
    if (!status.ok() || got != o.tokens) {
      std::fprintf(stderr, "grpc_stream_bench: call failed (%s), %d tokens\n", status.error_message().c_str(), got);
      return false;
    }
    sample->inbound_ms = (stamps.first_line.load() - send) / 1e6;
    sample->outbound_ms = (first_read - stamps.first_emit.load()) / 1e6;
    return true;
  };

  std::vector<Sample> sync_samples, callback_samples, worker_samples;
  constexpr int kWarmUp = 5;
  for (int i = -kWarmUp; i < o.requests; ++i) {  // alternated, so drift falls on all three
    Sample s, c, w;
    if (!one(*sync_stub, &s) || !one(*callback_stub, &c) || !one(*worker_stub, &w)) return 1;
    callback_service.Reap();
    if (i < 0) continue;
    sync_samples.push_back(s);
    callback_samples.push_back(c);
    worker_samples.push_back(w);
  }

  std::printf(
      "%d requests per API (%d token ids in, %d tokens out; first token %d us after arrival; sync server with %s "
      "completion queues)\n",
      o.requests, o.prompt_tokens, o.tokens, o.first_token_us,
      o.sync_cqs > 0 ? std::to_string(o.sync_cqs).c_str() : "gRPC's default number of");
  std::printf("%-9s %-28s %-28s %-28s\n", "api", "inbound ms p25/p50/p75", "outbound ms p25/p50/p75",
              "transit ms p25/p50/p75");
  for (const auto& [name, samples] : {std::pair{"sync", &sync_samples}, std::pair{"callback", &callback_samples},
                                      std::pair{"worker", &worker_samples}}) {
    std::vector<double> in, out, sum;
    for (const Sample& s : *samples) {
      in.push_back(s.inbound_ms);
      out.push_back(s.outbound_ms);
      sum.push_back(s.inbound_ms + s.outbound_ms);
    }
    std::printf("%-9s %-28s %-28s %-28s\n", name, Quartiles(in).c_str(), Quartiles(out).c_str(),
                Quartiles(sum).c_str());
  }
  sync_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  callback_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  (*worker_server)->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  return 0;
}

}  // namespace
}  // namespace lazykv

int main(int argc, char** argv) { return lazykv::Main(argc, argv); }
