// Drives one Engine on a thread of its own (the engine is single-threaded): gRPC
// handler threads hand requests in, and each request's events come back through its
// RequestStream. Cancellations and early stops are applied between steps.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "worker/engine.h"
#include "worker/serve/worker_metrics.h"

namespace lazykv {

// One request's events, in order: kToken..., then kFinished or kFailed.
class RequestStream {
 public:
  // The next event, or nullopt if none came within `timeout`.
  std::optional<EngineEvent> Next(std::chrono::milliseconds timeout);

 private:
  friend class GenerationLoop;
  void Push(EngineEvent event);

  std::mutex mu_;
  std::condition_variable ready_;
  std::deque<EngineEvent> events_;
  // Owned by the loop thread.
  RequestId id_ = 0;
  bool cancelled_before_start_ = false;
  std::optional<std::chrono::steady_clock::time_point> last_token_;
};

class GenerationLoop {
 public:
  GenerationLoop(std::unique_ptr<Engine> engine, std::shared_ptr<WorkerMetrics> metrics);
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

 private:
  struct Control {
    std::shared_ptr<RequestStream> stream;
    absl::Status reason;  // OK: stop early
  };
  void Run();
  void Dispatch(std::vector<EngineEvent>& events);

  std::unique_ptr<Engine> engine_;
  std::shared_ptr<WorkerMetrics> metrics_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::vector<std::pair<std::shared_ptr<RequestStream>, GenerateRequest>> inbox_;
  std::vector<Control> controls_;
  bool stopping_ = false;
  std::unordered_map<RequestId, std::shared_ptr<RequestStream>> streams_;  // loop thread only
  std::thread thread_;
};

}  // namespace lazykv
