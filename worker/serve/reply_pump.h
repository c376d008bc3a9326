// One submitted request run to its end for a streaming front end (the gRPC Generate call,
// the OpenAI-compatible HTTP API): its text through a TextStream, a stop string ending it
// early (tokens still in flight after it are dropped), the request cancelled in the
// engine when the client goes away, and the streamed tokens counted in the metrics.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "worker/serve/generation_loop.h"
#include "worker/tokenizer/text_stream.h"

namespace lazykv {

// Not thread-safe: used by one handler thread at a time.
class ReplyPump {
 public:
  struct Hooks {
    // A token for the client and its text (empty while a character is incomplete);
    // false: the client is gone (the request is cancelled with `gone()`).
    std::function<bool(const SampledToken& token, const std::string& text)> token;
    // The text held back until the end (only when not empty).
    std::function<void(const std::string& text)> rest;
    // Asked whenever no event came for 50 ms, and at least every 50 ms while events keep
    // coming: an error (the client went away, a deadline passed) cancels the request with it.
    std::function<absl::Status()> idle;
    // Why the client is gone, when `token` says so.
    std::function<absl::Status()> gone;
  };

  ReplyPump(GenerationLoop* loop, std::shared_ptr<RequestStream> stream, TextStream text);
  ~ReplyPump();  // cancels a request that has not ended; counts the streamed tokens
  ReplyPump(const ReplyPump&) = delete;
  ReplyPump& operator=(const ReplyPump&) = delete;

  // Waits for the engine's first event (kept for Run), asking `idle` meanwhile: a front
  // end that must choose a status before its first byte looks at it. Null after Run.
  const EngineEvent* First(const std::function<absl::Status()>& idle);
  // Runs the request to its end: its result, or its failure (a cancellation included).
  absl::StatusOr<std::shared_ptr<const GenerateResult>> Run(const Hooks& hooks);
  void Cancel(absl::Status why);

  int streamed() const { return streamed_; }
  bool stopped() const { return text_.stopped(); }  // a stop string ended the text
  // "stop" (end of sequence, a stop token or a stop string) or "length".
  std::string_view FinishReason(const GenerateResult& result) const;

 private:
  std::optional<EngineEvent> Next(const std::function<absl::Status()>& idle);

  GenerationLoop* loop_;
  std::shared_ptr<RequestStream> stream_;
  TextStream text_;
  static constexpr std::chrono::milliseconds kCheckEvery{50};
  std::optional<EngineEvent> first_;
  std::chrono::steady_clock::time_point last_check_ = std::chrono::steady_clock::now();
  int streamed_ = 0;  // tokens the client was given
  bool cancelled_ = false;
  bool ended_ = false;  // the engine reported the end (finished or failed)
};

}  // namespace lazykv
