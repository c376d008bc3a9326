#include "worker/serve/generation_loop.h"

#include "common/cpu_relax.h"
#include "spdlog/spdlog.h"

namespace lazykv {

std::optional<EngineEvent> RequestStream::Next(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  MutexLock lock(&mu_);
  while (events_.empty()) {
    if (!ready_.WaitUntil(&mu_, deadline) && events_.empty()) return std::nullopt;
  }
  EngineEvent event = std::move(events_.front());
  events_.pop_front();
  return event;
}

void RequestStream::Push(EngineEvent event) {
  {
    MutexLock lock(&mu_);
    events_.push_back(std::move(event));
  }
  ready_.Signal();
}

GenerationLoop::GenerationLoop(std::unique_ptr<Engine> engine, std::shared_ptr<WorkerMetrics> metrics,
                               GenerationLoopOptions options)
    : engine_(std::move(engine)), metrics_(std::move(metrics)), options_(options), thread_([this] { Run(); }) {}

GenerationLoop::~GenerationLoop() { Stop(); }

std::shared_ptr<RequestStream> GenerationLoop::Submit(GenerateRequest request) {
  auto stream = std::make_shared<RequestStream>();
  {
    MutexLock lock(&mu_);
    if (stopping_) {
      stream->Push(FailedEvent(0, absl::UnavailableError("the worker is shutting down")));
      return stream;
    }
    inbox_.emplace_back(stream, std::move(request));
    posted_.fetch_add(1, std::memory_order_release);
  }
  wake_.Signal();
  return stream;
}

void GenerationLoop::Cancel(const std::shared_ptr<RequestStream>& stream, absl::Status reason) {
  if (reason.ok()) reason = absl::CancelledError("cancelled");
  {
    MutexLock lock(&mu_);
    controls_.push_back(Control{stream, std::move(reason)});
    posted_.fetch_add(1, std::memory_order_release);
  }
  wake_.Signal();
}

void GenerationLoop::StopEarly(const std::shared_ptr<RequestStream>& stream) {
  {
    MutexLock lock(&mu_);
    controls_.push_back(Control{stream, absl::OkStatus()});
    posted_.fetch_add(1, std::memory_order_release);
  }
  wake_.Signal();
}

void GenerationLoop::Stop() {
  {
    MutexLock lock(&mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
    posted_.fetch_add(1, std::memory_order_release);
  }
  wake_.Signal();
  if (thread_.joinable()) thread_.join();
}

void GenerationLoop::SpinWhileIdle(uint64_t seen) {
  const auto deadline = std::chrono::steady_clock::now() + options_.idle_spin;
  while (true) {
    for (int i = 0; i < 64; ++i) {  // (a clock read costs about as much as 64 pauses)
      if (posted_.load(std::memory_order_acquire) != seen) {
        metrics_->CountIdleWatch(true);
        return;
      }
      CpuRelax();
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      metrics_->CountIdleWatch(false);
      return;
    }
  }
}

void GenerationLoop::Run() {
  std::vector<EngineEvent> events;
  uint64_t seen = 0;        // posted_ when the queues were last taken (all of it is in them)
  bool stop_taken = false;  // no watch once stopping: nothing is posted after Stop
  while (true) {
    decltype(inbox_) inbox;
    std::vector<Control> controls;
    bool stopping = false;
    if (options_.idle_spin.count() > 0 && !stop_taken && !engine_->HasWork()) SpinWhileIdle(seen);
    {
      MutexLock lock(&mu_);
      while (!stopping_ && inbox_.empty() && controls_.empty() && !engine_->HasWork()) wake_.Wait(&mu_);
      seen = posted_.load(std::memory_order_relaxed);  // posts change it under mu_
      inbox.swap(inbox_);
      controls.swap(controls_);
      stopping = stopping_;
      stop_taken = stopping;
    }
    // Controls first: a request cancelled before it reached the engine never starts.
    for (Control& c : controls) {
      if (c.stream->id_ == 0) {
        c.stream->cancelled_before_start_ = true;
        if (!c.reason.ok()) c.stream->Push(FailedEvent(0, c.reason));
      } else if (c.reason.ok()) {
        engine_->StopEarly(c.stream->id_);
      } else {
        engine_->Cancel(c.stream->id_, c.reason);
      }
    }
    for (auto& [stream, request] : inbox) {
      if (stream->cancelled_before_start_) continue;
      auto id = engine_->Submit(std::move(request));
      if (!id.ok()) {
        metrics_->CountRequest(std::string(absl::StatusCodeToString(id.status().code())));
        stream->Push(FailedEvent(0, id.status()));
        continue;
      }
      stream->id_ = *id;
      streams_.emplace(*id, stream);
    }
    if (stopping) {
      for (auto& [id, stream] : streams_) engine_->Cancel(id, absl::UnavailableError("the worker is shutting down"));
    }
    events.clear();
    const int ran = engine_->HasWork() ? engine_->Step(&events) : 0;
    Dispatch(events);
    metrics_->SetEngineState(engine_->stats());
    if (const ChunkPipeline* pipeline = engine_->pipeline()) {
      metrics_->ObservePipeline(pipeline->stats());
      metrics_->ObserveTransports(pipeline->tier().transport_stats());
    }
    if (stopping && !engine_->HasWork()) return;
    // Nothing runnable: the work waits on the cache tier (new requests still wake us
    // within a few milliseconds).
    if (ran == 0 && events.empty() && engine_->HasWork()) engine_->WaitForTier(std::chrono::milliseconds(5));
  }
}

void GenerationLoop::Dispatch(std::vector<EngineEvent>& events) {
  const auto now = std::chrono::steady_clock::now();
  for (EngineEvent& event : events) {
    auto it = streams_.find(event.id);
    if (it == streams_.end()) continue;
    RequestStream& stream = *it->second;
    switch (event.kind) {
      case EngineEvent::Kind::kToken:
        if (stream.last_token_)
          metrics_->ObserveInterToken(std::chrono::duration<double>(now - *stream.last_token_).count());
        stream.last_token_ = now;
        break;
      case EngineEvent::Kind::kFinished:
        metrics_->ObserveFinished(*event.result);
        metrics_->CountRequest("OK");
        break;
      case EngineEvent::Kind::kFailed:
        metrics_->CountRequest(std::string(absl::StatusCodeToString(event.status.code())));
        break;
    }
    const bool last = event.kind != EngineEvent::Kind::kToken;
    stream.Push(std::move(event));
    if (last) streams_.erase(it);
  }
}

}  // namespace lazykv
