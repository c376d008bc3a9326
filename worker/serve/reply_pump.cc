#include "worker/serve/reply_pump.h"

namespace lazykv {

ReplyPump::ReplyPump(GenerationLoop* loop, std::shared_ptr<RequestStream> stream, TextStream text)
    : loop_(loop), stream_(std::move(stream)), text_(std::move(text)) {}

ReplyPump::~ReplyPump() {
  if (!ended_) loop_->Cancel(stream_, absl::CancelledError("the call ended"));
  loop_->metrics().CountGenerated(streamed_);
}

void ReplyPump::Cancel(absl::Status why) {
  if (cancelled_) return;
  cancelled_ = true;
  loop_->Cancel(stream_, std::move(why));
}

std::optional<EngineEvent> ReplyPump::Next(const std::function<absl::Status()>& idle) {
  if (first_) {
    std::optional<EngineEvent> event = std::move(first_);
    first_.reset();
    return event;
  }
  std::optional<EngineEvent> event = stream_->Next(kCheckEvery);
  // Asked when no event came, and every kCheckEvery while events keep coming: a request whose
  // tokens never pause must still end at its deadline or when its client goes away.
  const auto now = std::chrono::steady_clock::now();
  if (!cancelled_ && (!event || now - last_check_ >= kCheckEvery)) {
    last_check_ = now;
    if (absl::Status status = idle(); !status.ok()) Cancel(std::move(status));
  }
  return event;
}

const EngineEvent* ReplyPump::First(const std::function<absl::Status()>& idle) {
  while (!first_) first_ = Next(idle);
  if (first_->kind == EngineEvent::Kind::kFailed) ended_ = true;
  return &*first_;
}

absl::StatusOr<std::shared_ptr<const GenerateResult>> ReplyPump::Run(const Hooks& hooks) {
  while (true) {
    std::optional<EngineEvent> event = Next(hooks.idle);
    if (!event) continue;
    switch (event->kind) {
      case EngineEvent::Kind::kToken: {
        if (text_.stopped() || cancelled_) break;  // stopping: tokens still in flight
        const std::string piece = text_.Add(event->token.id);
        ++streamed_;
        if (text_.stopped()) loop_->StopEarly(stream_);
        if (!hooks.token(event->token, piece)) Cancel(hooks.gone());
        break;
      }
      case EngineEvent::Kind::kFinished:
        ended_ = true;
        if (const std::string rest = text_.Flush(); !rest.empty()) hooks.rest(rest);
        return event->result;
      case EngineEvent::Kind::kFailed:
        ended_ = true;
        return event->status;
    }
  }
}

std::string_view ReplyPump::FinishReason(const GenerateResult& result) const {
  return text_.stopped() || result.finish_reason == "stop" ? "stop" : "length";
}

}  // namespace lazykv
