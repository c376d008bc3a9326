#include "bench/load_replay.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>

#include "absl/strings/str_format.h"
#include "bench/document_text.h"
#include "common/grpc_util.h"
#include "common/monotonic_clock.h"
#include "common/mutex.h"
#include "proto/generate.grpc.pb.h"
#include "spdlog/spdlog.h"

namespace lazykv {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
double Millis(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

// "[#####-----] 12/200" redrawn in place on stderr. Thread-safe: every client ticks it.
class ProgressBar {
 public:
  ProgressBar(size_t total, bool enabled) : total_(total), enabled_(enabled) { Draw(); }
  ~ProgressBar() {
    if (enabled_) std::fputs("\n", stderr);
  }
  void Tick() ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    ++done_;
    Draw();
  }

 private:
  void Draw() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!enabled_ || total_ == 0) return;
    constexpr size_t kWidth = 40;
    const size_t filled = kWidth * done_ / total_;
    std::fprintf(stderr, "\r[%s%s] %zu/%zu requests", std::string(filled, '#').c_str(),
                 std::string(kWidth - filled, '-').c_str(), done_, total_);
    std::fflush(stderr);
  }

  Mutex mu_;
  size_t done_ ABSL_GUARDED_BY(mu_) = 0;
  const size_t total_;
  const bool enabled_;
};

// The largest token id the trace sends, plus one: the vocabulary it needs.
int NeededVocab(const RagTrace& trace) {
  int32_t max_id = 0;
  for (const auto& doc : trace.documents) {
    for (int32_t t : doc) max_id = std::max(max_id, t);
  }
  for (const TraceRequest& r : trace.requests) {
    for (int32_t t : r.question) max_id = std::max(max_id, t);
  }
  return std::max(trace.options.vocab_size, max_id + 1);
}

class Replayer {
 public:
  Replayer(const RagTrace& trace, const ReplayOptions& options) : trace_(trace), options_(options) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(64 << 20);
    args.SetMaxSendMessageSize(64 << 20);
    stub_ = v1::Generation::NewStub(MakeClientChannel(options.target, options.security, args));
  }

  absl::Status CheckVocabulary(ReplayRun& run) {
    v1::TokenizeRequest request;
    request.set_text("a");
    v1::TokenizeResponse response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    context.set_wait_for_ready(true);  // a worker that just started may still be binding
    if (absl::Status s = FromGrpcStatus(stub_->Tokenize(&context, request, &response)); !s.ok()) {
      return absl::UnavailableError(
          absl::StrFormat("the worker at %s did not answer Tokenize within 10 s: %s", options_.target, s.ToString()));
    }
    run.worker_vocab_size = response.vocab_size();
    run.worker_max_context = response.max_context();
    const int needed = NeededVocab(trace_);
    if (response.vocab_size() < needed) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "the trace's token ids need a vocabulary of %d but the worker at %s has %d tokens: generate the trace "
          "with `lazykv-bench trace --vocab %d` or less",
          needed, options_.target, response.vocab_size(), response.vocab_size()));
    }
    return absl::OkStatus();
  }

  ReplayRun Run(ReplayRun run) {
    const size_t n = trace_.requests.size();
    run.results.resize(n);
    ProgressBar progress(n, options_.progress);
    std::vector<std::thread> threads;
    start_ = Clock::now();
    if (trace_.options.rate > 0) {
      // Open loop: each request starts at its arrival offset, whatever is in flight, on a
      // detached thread (a long trace would otherwise hold every finished thread's stack).
      Mutex mu;
      CondVar all_done;
      size_t finished = 0;  // guarded by mu
      for (size_t k = 0; k < n; ++k) {
        const Clock::time_point intended = start_ + std::chrono::duration_cast<Clock::duration>(
                                                        std::chrono::duration<double>(trace_.requests[k].arrival_s));
        std::this_thread::sleep_until(intended);
        std::thread([this, k, intended, n, &run, &progress, &mu, &all_done, &finished] {
          run.results[k] = RunOne(trace_.requests[k], intended);
          progress.Tick();
          MutexLock lock(&mu);
          if (++finished == n) all_done.Signal();
        }).detach();
      }
      MutexLock lock(&mu);
      while (finished != n) all_done.Wait(&mu);
    } else {
      // Closed loop: `concurrency` clients, each sends its next request when one ends.
      std::atomic<size_t> next{0};
      const size_t clients = std::min<size_t>(std::max(1, trace_.options.concurrency), n);
      for (size_t c = 0; c < clients; ++c) {
        threads.emplace_back([this, n, &next, &run, &progress] {
          for (size_t k; (k = next.fetch_add(1)) < n;) {
            run.results[k] = RunOne(trace_.requests[k], Clock::now());
            progress.Tick();
          }
        });
      }
    }
    for (std::thread& t : threads) t.join();
    run.wall_s = Seconds(Clock::now() - start_);
    return run;
  }

 private:
  v1::GenerateRequest BuildRequest(const TraceRequest& r) const {
    v1::GenerateRequest request;
    request.set_request_id(absl::StrFormat("trace-%d", r.id));
    for (int d : r.doc_ids) {
      if (options_.document_text_bytes > 0) {
        request.add_documents()->set_text(DocumentText(d, options_.document_text_bytes));
        continue;
      }
      const auto& tokens = trace_.documents[d];
      request.add_documents()->mutable_tokens()->mutable_ids()->Add(tokens.begin(), tokens.end());
    }
    request.mutable_prompt_tokens()->mutable_ids()->Add(r.question.begin(), r.question.end());
    request.mutable_sampling()->set_max_tokens(r.max_tokens);
    request.mutable_sampling()->set_temperature(0);  // greedy: modes comparable token for token
    request.set_mode(options_.mode);
    return request;
  }

  RequestResult RunOne(const TraceRequest& r, Clock::time_point intended) {
    RequestResult result;
    result.id = r.id;
    result.scheduled_s = Seconds(intended - start_);
    const v1::GenerateRequest request = BuildRequest(r);
    grpc::ClientContext context;
    if (options_.deadline_ms > 0) {
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(options_.deadline_ms));
    }
    const Clock::time_point sent = Clock::now();
    result.sent_s = Seconds(sent - start_);
    result.sent_monotonic_ns = MonotonicNanos(sent);
    std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader = stub_->Generate(&context, request);
    v1::GenerateResponse response;
    Clock::time_point last;
    bool done = false;
    while (reader->Read(&response)) {
      const Clock::time_point now = Clock::now();
      if (response.has_delta() && response.delta().token_ids_size() > 0) {
        if (result.tokens_received == 0) {
          result.ttft_ms = Millis(now - intended);
          result.first_read_monotonic_ns = MonotonicNanos(now);
        } else {
          result.itl_ms.push_back(Millis(now - last));
        }
        last = now;
        result.tokens_received += response.delta().token_ids_size();
        result.output_tokens.insert(result.output_tokens.end(), response.delta().token_ids().begin(),
                                    response.delta().token_ids().end());
      } else if (response.has_done()) {
        done = true;
        CopyDone(response.done(), result);
      }
    }
    absl::Status status = FromGrpcStatus(reader->Finish());
    result.total_ms = Millis(Clock::now() - intended);
    if (status.ok() && !done) status = absl::InternalError("the stream ended without its final message");
    if (!status.ok()) {
      result.status = absl::StatusCodeToString(status.code());
      result.error = std::string(status.message());
    }
    return result;
  }

  static void CopyDone(const v1::GenerateDone& done, RequestResult& result) {
    result.finish_reason = v1::FinishReason_Name(done.finish_reason());
    result.mode = done.mode();
    const v1::Usage& u = done.usage();
    result.usage = UsageCounts{.prompt_tokens = u.prompt_tokens(),
                               .completion_tokens = u.completion_tokens(),
                               .pool_tokens = u.pool_tokens(),
                               .host_tokens = u.host_tokens(),
                               .disk_tokens = u.disk_tokens(),
                               .remote_tokens = u.remote_tokens(),
                               .computed_tokens = u.computed_tokens(),
                               .document_tokens = u.document_tokens(),
                               .document_cached_tokens = u.document_cached_tokens(),
                               .document_computed_tokens = u.document_computed_tokens(),
                               .chunk_hits = u.chunk_hits(),
                               .chunk_misses = u.chunk_misses(),
                               .cached_documents = u.cached_documents(),
                               .chunk_recomputes = u.chunk_recomputes(),
                               .recomputed_tokens = u.recomputed_tokens(),
                               .kv_bytes_copied = u.kv_bytes_copied(),
                               .kv_bytes_fetched = u.kv_bytes_fetched(),
                               .host_bytes_fetched = u.host_bytes_fetched(),
                               .disk_bytes_fetched = u.disk_bytes_fetched(),
                               .remote_bytes_fetched = u.remote_bytes_fetched()};
    result.server_queue_ms = done.timings().queue_ms();
    result.server_ttft_ms = done.timings().ttft_ms();
    result.server_total_ms = done.timings().total_ms();
    result.server_arrival_monotonic_ns = done.timings().arrival_monotonic_ns();
    result.server_first_in_handler_monotonic_ns = done.timings().first_token_in_handler_monotonic_ns();
    result.server_first_write_monotonic_ns = done.timings().first_write_monotonic_ns();
  }

  const RagTrace& trace_;
  const ReplayOptions options_;
  std::unique_ptr<v1::Generation::Stub> stub_;
  Clock::time_point start_;
};

}  // namespace

absl::StatusOr<ReplayRun> ReplayTrace(const RagTrace& trace, const ReplayOptions& options) {
  Replayer replayer(trace, options);
  ReplayRun run;
  if (absl::Status s = replayer.CheckVocabulary(run); !s.ok()) return s;
  int longest = 0;
  for (const TraceRequest& r : trace.requests) {
    int length = 1 + static_cast<int>(r.question.size()) + r.max_tokens;  // the anchor, the prompt, the output
    for (int d : r.doc_ids) length += static_cast<int>(trace.documents[d].size());
    longest = std::max(longest, length);
  }
  if (run.worker_max_context > 0 && longest > run.worker_max_context) {
    spdlog::warn("the longest request needs about {} tokens, past the worker's context of {}: expect INVALID_ARGUMENT",
                 longest, run.worker_max_context);
  }
  return replayer.Run(std::move(run));
}

}  // namespace lazykv
