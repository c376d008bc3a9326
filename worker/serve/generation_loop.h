// Drives one Engine on a thread of its own (the engine is single-threaded): gRPC
// handler threads hand requests in, and each request's events come back through its
// RequestStream. Cancellations and early stops are applied between steps.
#pragma once

#include <atomic>
#include <deque>
#include <memory>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "worker/engine/engine.h"
#include "worker/serve/worker_metrics.h"

namespace lazykv {

// One request's events, in order: kToken..., then kFinished or kFailed. Thread-safe:
// the loop thread pushes, one gRPC handler thread reads.
class RequestStream {
 public:
  // The next event, or nullopt if none came within `timeout`.
  std::optional<EngineEvent> Next(std::chrono::milliseconds timeout);

 private:
  friend class GenerationLoop;
  void Push(EngineEvent event) ABSL_LOCKS_EXCLUDED(mu_);

  Mutex mu_;
  CondVar ready_;  // events_ gained an event
  std::deque<EngineEvent> events_ ABSL_GUARDED_BY(mu_);
  // Owned by the loop thread.
  RequestId id_ = 0;
  bool cancelled_before_start_ = false;
  std::optional<std::chrono::steady_clock::time_point> last_token_;
};

struct GenerationLoopOptions {
  // When the engine runs out of work, its thread watches for the next request (or control) this
  // long before it sleeps on its condition variable: a request arriving meanwhile is taken at
  // once, without waking a sleeping thread (on a VM whose idle vCPUs halt, that wake-up costs
  // about 0.1 ms of TTFT: bench/results/engine_spin_2026-11-29.md). At most one core, for at
  // most this long after each time the engine goes idle. 0: sleep at once.
  std::chrono::microseconds idle_spin{0};
};

// Thread-safe: Submit, Cancel, StopEarly and Stop may be called from any thread; the
// engine itself is touched only by the loop's own thread.
class GenerationLoop {
 public:
  GenerationLoop(std::unique_ptr<Engine> engine, std::shared_ptr<WorkerMetrics> metrics,
                 GenerationLoopOptions options = {});
  ~GenerationLoop();  // Stop()

  // Queues a request. A refused one (invalid, queue full, shutting down) gets a single
  // kFailed event.
  std::shared_ptr<RequestStream> Submit(GenerateRequest request);
  // Frees the request's blocks at once; it ends with kFailed(reason).
  void Cancel(const std::shared_ptr<RequestStream>& stream, absl::Status reason);
  // Ends the request now as if it had sampled end-of-sequence (a stop string matched):
  // it ends with kFinished.
  void StopEarly(const std::shared_ptr<RequestStream>& stream);
  // Fails what is queued or running with UNAVAILABLE and joins the thread.
  void Stop();

  // Immutable after construction: safe from any thread.
  const Engine& engine() const { return *engine_; }
  WorkerMetrics& metrics() const { return *metrics_; }  // thread-safe (Prometheus counters)

  // Idle spins that ended because work was posted, and those that ran out (any thread; the
  // metric lazykv_worker_engine_idle_watches_total, counted since this loop's metrics began).
  struct IdleSpins {
    uint64_t caught = 0;
    uint64_t expired = 0;
  };
  IdleSpins idle_spins() const { return {metrics_->IdleWatches(true), metrics_->IdleWatches(false)}; }

 private:
  struct Control {
    std::shared_ptr<RequestStream> stream;
    absl::Status reason;  // OK: stop early
  };
  void Run();
  // Returns once posted_ differs from `seen` or the idle spin has run out.
  void SpinWhileIdle(uint64_t seen);
  void Dispatch(std::vector<EngineEvent>& events);

  std::unique_ptr<Engine> engine_;
  std::shared_ptr<WorkerMetrics> metrics_;
  Mutex mu_;
  CondVar wake_;  // inbox_, controls_ or stopping_ changed
  std::vector<std::pair<std::shared_ptr<RequestStream>, GenerateRequest>> inbox_ ABSL_GUARDED_BY(mu_);
  std::vector<Control> controls_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Counts every change to inbox_, controls_ and stopping_ (written under mu_), so that the idle
  // loop thread can watch for work without the lock.
  std::atomic<uint64_t> posted_{0};
  const GenerationLoopOptions options_;
  std::unordered_map<RequestId, std::shared_ptr<RequestStream>> streams_;  // loop thread only
  std::thread thread_;
};

}  // namespace lazykv
