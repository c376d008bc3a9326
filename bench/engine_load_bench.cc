#include "bench/engine_load_bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>
#include <unordered_map>

#include "absl/strings/str_format.h"
#include "common/splitmix64.h"
#include "spdlog/spdlog.h"

namespace lazykv {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsBetween(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

// Arrival offsets in seconds: exponential gaps at `rate` (Poisson), all 0 at infinity.
// Seeded from the trace, so every mode sees the same arrivals.
std::vector<double> ArrivalOffsets(size_t n, double rate, uint64_t seed) {
  std::vector<double> offsets(n, 0.0);
  if (!std::isfinite(rate)) return offsets;
  uint64_t rng = seed ^ 0xa77e'4a15'0000'0001ULL;  // not the trace's own stream
  double clock = 0;
  for (double& offset : offsets) {
    clock += -std::log(1 - SplitMix64Unit(rng)) / rate;
    offset = clock;
  }
  return offsets;
}

// A submitted request the loop waits on.
struct InFlight {
  size_t index = 0;             // in the trace
  Clock::time_point sendable;   // when a client could have sent it
  Clock::time_point submitted;  // when the loop did
};

// Per-step counters of the engine's state, sampled before each step that ran tokens.
struct StepCounters {
  int64_t steps = 0, running = 0, decoding = 0, queued = 0;
  int max_running = 0, max_decoding = 0, max_queued = 0;
  int peak_used = 0, peak_reserved = 0;
  double step_seconds = 0;
  int64_t decode_steps = 0, decode_tokens = 0;
  double decode_seconds = 0;

  void SamplePool(const EngineStats& s) {
    peak_used = std::max(peak_used, s.num_blocks - s.free_blocks);
    peak_reserved = std::max(peak_reserved, s.reserved_blocks);
  }
  // `s` from before the step; it ran `ran` tokens in `seconds`.
  void SampleStep(const EngineStats& s, int ran, double seconds) {
    ++steps;
    step_seconds += seconds;
    if (s.decoding_requests > 0 && ran == s.decoding_requests) {  // decode only, no prefill
      ++decode_steps;
      decode_tokens += ran;
      decode_seconds += seconds;
    }
    running += s.running_requests;
    decoding += s.decoding_requests;
    queued += s.queued_requests;
    max_running = std::max(max_running, s.running_requests);
    max_decoding = std::max(max_decoding, s.decoding_requests);
    max_queued = std::max(max_queued, s.queued_requests);
  }
};

}  // namespace

std::vector<GenerateRequest> TraceToRequests(const RagTrace& trace) {
  std::vector<GenerateRequest> requests;
  for (const TraceRequest& r : trace.requests) {
    GenerateRequest request;
    for (int d : r.doc_ids) request.docs.push_back(trace.documents[d]);
    request.prompt = r.question;
    request.sampling.max_tokens = r.max_tokens;
    requests.push_back(std::move(request));
  }
  return requests;
}

absl::StatusOr<ModeLoadResult> RunEngineLoad(Engine& engine, const RagTrace& trace, const LoadOptions& options) {
  if (!(options.request_rate > 0) || options.max_concurrency < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("request rate %g must be positive and max concurrency %d not negative", options.request_rate,
                        options.max_concurrency));
  }
  const std::vector<GenerateRequest> requests = TraceToRequests(trace);
  const size_t n = requests.size();
  ModeLoadResult out;
  out.mode = engine.default_mode();
  out.requests = static_cast<int>(n);
  out.tokens.resize(n);
  out.num_blocks = engine.stats().num_blocks;
  for (const GenerateRequest& r : requests) {
    out.worst_case_blocks = std::max(out.worst_case_blocks, engine.ReservedBlocks(r));
  }
  out.worst_case_requests_fit = out.worst_case_blocks > 0 ? out.num_blocks / out.worst_case_blocks : 0;
  const uint64_t evictions_before = engine.stats().evictions;

  const std::vector<double> arrivals = ArrivalOffsets(n, options.request_rate, trace.options.seed);
  const size_t max_in_flight = options.max_concurrency > 0 ? options.max_concurrency : n;
  std::unordered_map<RequestId, InFlight> in_flight;
  std::vector<double> ttft_ms, queue_ms;
  std::map<int64_t, std::vector<double>> ttft_by_cached;
  StepCounters counters;
  std::vector<EngineEvent> events;
  const Clock::time_point start = Clock::now();
  Clock::time_point slot_opened = start, last_done = start;
  auto arrival = [&](size_t i) {
    return start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(arrivals[i]));
  };
  auto fail = [&](const absl::Status& status) {
    if (out.failed++ == 0) out.first_error = status.ToString();
  };
  size_t next = 0, done = 0;
  int64_t idle_steps = 0;
  while (done < n) {
    const Clock::time_point now = Clock::now();
    while (next < n && arrival(next) <= now && in_flight.size() < max_in_flight) {
      absl::StatusOr<RequestId> id = engine.Submit(requests[next]);
      if (id.ok()) {
        in_flight[*id] = InFlight{.index = next, .sendable = std::max(arrival(next), slot_opened), .submitted = now};
      } else {
        fail(id.status());
        ++done;
      }
      ++next;
    }
    if (!engine.HasWork()) {
      if (next < n && in_flight.size() < max_in_flight) std::this_thread::sleep_until(arrival(next));
      if (next >= n && done < n) return absl::InternalError("the engine has no work but requests are unanswered");
      continue;
    }
    const EngineStats before = engine.stats();
    counters.SamplePool(before);
    events.clear();
    const Clock::time_point step_start = Clock::now();
    const int ran = engine.Step(&events);
    const Clock::time_point after = Clock::now();
    if (ran > 0) counters.SampleStep(before, ran, SecondsBetween(step_start, after));
    counters.SamplePool(engine.stats());
    for (const EngineEvent& event : events) {
      if (event.kind == EngineEvent::Kind::kToken) continue;
      auto it = in_flight.find(event.id);
      if (it == in_flight.end()) continue;
      if (event.kind == EngineEvent::Kind::kFinished) {
        const GenerateResult& result = *event.result;
        const InFlight& f = it->second;
        // The engine's TTFT runs from submission; the client's from when it could send.
        ttft_ms.push_back((result.ttft_seconds + SecondsBetween(f.sendable, f.submitted)) * 1e3);
        ttft_by_cached[result.usage.cached_documents].push_back(ttft_ms.back());
        queue_ms.push_back(result.queue_seconds * 1e3);
        out.tokens[f.index] = result.tokens;
        out.output_tokens += static_cast<int64_t>(result.tokens.size());
        out.prompt_tokens += result.usage.prompt_tokens;
        out.cached_tokens += result.usage.cached_tokens;
        out.computed_tokens += result.usage.computed_tokens;
        out.kv_bytes_copied += result.usage.kv_bytes_copied;
        ++out.completed;
      } else {
        fail(event.status);
      }
      if (in_flight.size() == max_in_flight) slot_opened = after;  // a waiting request may go now
      in_flight.erase(it);
      ++done;
      last_done = after;
    }
    // Without a cache tier an engine with work always runs something or reports it.
    idle_steps = ran == 0 && events.empty() ? idle_steps + 1 : 0;
    if (idle_steps > 0) engine.WaitForTier(std::chrono::milliseconds(1));
    if (idle_steps > 100000) return absl::InternalError("the engine stopped making progress");
  }

  out.duration_s = SecondsBetween(start, last_done);
  out.ttft_ms = Summarize(ttft_ms);
  for (const auto& [cached, values] : ttft_by_cached) out.ttft_ms_by_cached_documents[cached] = Summarize(values);
  out.queue_ms = Summarize(queue_ms);
  if (out.duration_s > 0) {
    out.request_throughput = out.completed / out.duration_s;
    out.output_throughput = out.output_tokens / out.duration_s;
  }
  out.steps = counters.steps;
  if (counters.steps > 0) {
    out.mean_running = static_cast<double>(counters.running) / counters.steps;
    out.mean_decoding = static_cast<double>(counters.decoding) / counters.steps;
    out.mean_queued = static_cast<double>(counters.queued) / counters.steps;
    out.mean_step_ms = counters.step_seconds * 1e3 / counters.steps;
  }
  out.decode_steps = counters.decode_steps;
  if (counters.decode_steps > 0) {
    out.decode_step_ms = counters.decode_seconds * 1e3 / counters.decode_steps;
    out.decode_step_batch = static_cast<double>(counters.decode_tokens) / counters.decode_steps;
  }
  out.max_running = counters.max_running;
  out.max_decoding = counters.max_decoding;
  out.max_queued = counters.max_queued;
  out.peak_blocks_used = counters.peak_used;
  out.peak_blocks_reserved = counters.peak_reserved;
  out.evictions = engine.stats().evictions - evictions_before;
  return out;
}

absl::StatusOr<std::vector<ModeLoadResult>> RunModesUnderLoad(
    Backend& backend, const RagTrace& trace, const std::vector<AttentionMode>& modes, const LoadOptions& options,
    const std::function<void(const ModeLoadResult&)>& on_mode_done) {
  std::vector<ModeLoadResult> results;
  for (AttentionMode mode : modes) {
    EngineOptions engine_options{.mode = mode,
                                 .anchor = {},
                                 .max_prefill_tokens = options.max_prefill_tokens,
                                 .max_queued_requests = std::max<int>(64, trace.requests.size()),
                                 .tier = nullptr,
                                 .pipeline = {}};
    auto engine = Engine::Create(std::make_unique<BorrowedBackend>(&backend), std::move(engine_options));
    if (!engine.ok()) return engine.status();
    auto result = RunEngineLoad(**engine, trace, options);
    if (!result.ok()) {
      return absl::Status(result.status().code(),
                          absl::StrFormat("mode %s: %s", AttentionModeName(mode), result.status().message()));
    }
    spdlog::info(
        "mode {}: {} of {} requests in {:.2f} s, mean TTFT {:.1f} ms, {:.1f} output tokens/s; {} steps of "
        "{:.2f} ms on average, {} of them decode only, at a batch of {:.1f} in {:.2f} ms",
        AttentionModeName(mode), result->completed, result->requests, result->duration_s, result->ttft_ms.mean,
        result->output_throughput, result->steps, result->mean_step_ms, result->decode_steps, result->decode_step_batch,
        result->decode_step_ms);
    if (on_mode_done) on_mode_done(*result);
    results.push_back(*std::move(result));
  }
  return results;
}

}  // namespace lazykv
