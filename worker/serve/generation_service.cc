#include "worker/serve/generation_service.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/grpc_util.h"
#include "common/monotonic_clock.h"
#include "spdlog/spdlog.h"
#include "worker/serve/reply_pump.h"
#include "worker/tokenizer/text_stream.h"

namespace lazykv {
namespace {

using Clock = std::chrono::steady_clock;

double MillisSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// A call that can no longer be written to: past its deadline, or cancelled by the client.
absl::Status WhyCallEnded(const grpc::ServerContext& context) {
  // The client's own deadline timer may end the stream a little before ours fires.
  if (context.deadline() <= std::chrono::system_clock::now() + std::chrono::milliseconds(100)) {
    return absl::DeadlineExceededError("deadline exceeded");
  }
  return absl::CancelledError("the client cancelled the call");
}

void FillDone(const GenerateResult& result, const std::string& request_id, int streamed_tokens, bool stopped,
              double total_ms, v1::GenerateDone* done) {
  done->set_request_id(request_id);
  done->set_finish_reason(stopped || result.finish_reason == "stop" ? v1::FINISH_REASON_STOP
                                                                    : v1::FINISH_REASON_LENGTH);
  done->set_mode(std::string(AttentionModeName(result.mode)));
  const Usage& u = result.usage;
  v1::Usage* usage = done->mutable_usage();
  usage->set_prompt_tokens(u.prompt_tokens);
  usage->set_completion_tokens(streamed_tokens);
  usage->set_pool_tokens(u.pool_tokens);
  usage->set_host_tokens(u.host_tokens);
  usage->set_disk_tokens(u.disk_tokens);
  usage->set_remote_tokens(u.remote_tokens);
  usage->set_computed_tokens(u.computed_tokens);
  usage->set_document_tokens(u.document_tokens);
  usage->set_document_cached_tokens(u.document_cached_tokens);
  usage->set_document_computed_tokens(u.document_computed_tokens);
  usage->set_chunk_hits(u.chunk_hits);
  usage->set_cached_documents(u.cached_documents);
  usage->set_chunk_misses(u.chunk_misses);
  usage->set_chunk_recomputes(u.chunk_recomputes);
  usage->set_recomputed_tokens(u.recomputed_tokens);
  usage->set_repaired_tokens(u.repaired_tokens);
  usage->set_kv_bytes_copied(u.kv_bytes_copied);
  usage->set_kv_bytes_fetched(u.kv_bytes_fetched);
  usage->set_host_bytes_fetched(u.host_bytes_fetched);
  usage->set_disk_bytes_fetched(u.disk_bytes_fetched);
  usage->set_remote_bytes_fetched(u.remote_bytes_fetched);
  done->set_seed(result.seed);
  v1::Timings* timings = done->mutable_timings();
  timings->set_queue_ms(result.queue_seconds * 1e3);
  timings->set_ttft_ms(result.ttft_seconds * 1e3);
  timings->set_total_ms(total_ms);
}

}  // namespace

absl::StatusOr<GenerateRequest> ToEngineRequest(const v1::GenerateRequest& call, const Tokenizer& tokenizer,
                                                const GenerationServiceOptions& options,
                                                const std::function<absl::Status()>& still_wanted) {
  auto check_wanted = [&]() { return still_wanted ? still_wanted() : absl::OkStatus(); };
  GenerateRequest request;
  if (call.documents_size() > options.max_documents) {
    return absl::InvalidArgumentError(absl::StrFormat("documents: %d documents, at most %d are accepted",
                                                      call.documents_size(), options.max_documents));
  }
  // Sizes first: a request over a limit costs no tokenizing.
  for (int d = 0; d < call.documents_size(); ++d) {
    if (call.documents(d).content_case() == v1::Document::kText &&
        call.documents(d).text().size() > options.max_text_bytes) {
      return absl::InvalidArgumentError(absl::StrFormat("documents[%d].text: %d bytes, at most %d are accepted", d,
                                                        call.documents(d).text().size(), options.max_text_bytes));
    }
  }
  if (call.prompt_case() == v1::GenerateRequest::kPromptText && call.prompt_text().size() > options.max_text_bytes) {
    return absl::InvalidArgumentError(absl::StrFormat("prompt_text: %d bytes, at most %d are accepted",
                                                      call.prompt_text().size(), options.max_text_bytes));
  }
  for (int d = 0; d < call.documents_size(); ++d) {
    const v1::Document& doc = call.documents(d);
    std::vector<int32_t> tokens;
    switch (doc.content_case()) {
      case v1::Document::kText:
        if (absl::Status wanted = check_wanted(); !wanted.ok()) return wanted;
        tokens = options.document_tokens != nullptr ? options.document_tokens->Encode(doc.text())
                                                    : tokenizer.Encode(doc.text());
        break;
      case v1::Document::kTokens:
        tokens.assign(doc.tokens().ids().begin(), doc.tokens().ids().end());
        break;
      case v1::Document::CONTENT_NOT_SET:
        break;
    }
    if (tokens.empty()) return absl::InvalidArgumentError(absl::StrFormat("documents[%d] is empty", d));
    request.docs.push_back(std::move(tokens));
  }
  if (call.prompt_case() == v1::GenerateRequest::kPromptText) {
    if (absl::Status wanted = check_wanted(); !wanted.ok()) return wanted;
    request.prompt = tokenizer.Encode(call.prompt_text());
  } else if (call.prompt_case() == v1::GenerateRequest::kPromptTokens) {
    request.prompt.assign(call.prompt_tokens().ids().begin(), call.prompt_tokens().ids().end());
  }
  if (request.docs.empty() && request.prompt.empty()) {
    return absl::InvalidArgumentError("empty request: set documents or a prompt (prompt_text or prompt_tokens)");
  }
  const v1::SamplingParams& s = call.sampling();
  if (s.max_tokens() < 0) {
    return absl::InvalidArgumentError(absl::StrFormat("sampling.max_tokens: %d is negative", s.max_tokens()));
  }
  request.sampling.max_tokens = s.max_tokens() == 0 ? options.default_max_tokens : s.max_tokens();
  request.sampling.temperature = s.temperature();
  request.sampling.top_p = s.top_p() == 0 ? 1.0f : s.top_p();
  if (s.has_seed()) request.sampling.seed = s.seed();
  request.sampling.stop_token_ids.assign(s.stop_token_ids().begin(), s.stop_token_ids().end());
  if (absl::Status status = request.sampling.Validate(); !status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("sampling.", status.message()));
  }
  if (s.stop_size() > options.max_stop_strings) {
    return absl::InvalidArgumentError(
        absl::StrFormat("sampling.stop: %d stop strings, at most %d", s.stop_size(), options.max_stop_strings));
  }
  for (int i = 0; i < s.stop_size(); ++i) {
    if (s.stop(i).empty() || s.stop(i).size() > options.max_stop_bytes) {
      return absl::InvalidArgumentError(
          absl::StrFormat("sampling.stop[%d]: must hold 1 to %d bytes", i, options.max_stop_bytes));
    }
  }
  if (!call.mode().empty()) {
    auto mode = ParseAttentionMode(call.mode());
    if (!mode.ok()) return absl::InvalidArgumentError(absl::StrCat("mode: ", mode.status().message()));
    request.mode = *mode;
  }
  request.repair_tokens = call.repair_tokens();  // range checked by the engine, naming the field
  return request;
}

std::vector<int32_t> ReplyContext(const std::vector<int32_t>& anchor, const GenerateRequest& request) {
  std::vector<int32_t> context = anchor;
  const auto& last = request.prompt.empty() && !request.docs.empty() ? request.docs.back() : request.prompt;
  context.insert(context.end(), last.end() - std::min(last.size(), TextStream::kContextTokens), last.end());
  return context;
}

GenerationService::GenerationService(GenerationLoop* loop, const Tokenizer* tokenizer, GenerationServiceOptions options,
                                     const CallAuthorizer* authorizer)
    : loop_(loop),
      tokenizer_(tokenizer),
      options_(options),
      allow_all_(authorizer == nullptr ? CallAuthorizer::AllowAll() : nullptr),
      authorizer_(authorizer == nullptr ? allow_all_.get() : authorizer) {}

grpc::Status GenerationService::Authorize(const grpc::ServerContext* context) {
  absl::StatusOr<Principal> caller = authorizer_->Authorize(*context, Role::kClient);
  if (caller.ok()) return grpc::Status::OK;
  loop_->metrics().CountRequest(std::string(absl::StatusCodeToString(caller.status().code())));
  return ToGrpcStatus(caller.status());
}

grpc::Status GenerationService::Generate(grpc::ServerContext* context, const v1::GenerateRequest* call,
                                         grpc::ServerWriter<v1::GenerateResponse>* writer) {
  const Clock::time_point arrival = Clock::now();
  if (grpc::Status refused = Authorize(context); !refused.ok()) return refused;
  auto request = ToEngineRequest(*call, *tokenizer_, options_, [context]() -> absl::Status {
    if (context->deadline() < std::chrono::system_clock::now()) {
      return absl::DeadlineExceededError("deadline passed while tokenizing");
    }
    if (context->IsCancelled()) return absl::CancelledError("client cancelled while tokenizing");
    return absl::OkStatus();
  });
  if (!request.ok()) {  // refused before the engine: counted here, as the loop counts its own
    loop_->metrics().CountRequest(std::string(absl::StatusCodeToString(request.status().code())));
    return ToGrpcStatus(request.status());
  }
  request->arrival = arrival;  // queue time and TTFT count from here, as total_ms does
  TextStream text(*tokenizer_, ReplyContext(loop_->engine().anchor(), *request),
                  std::vector<std::string>(call->sampling().stop().begin(), call->sampling().stop().end()));
  // Generated tokens are what the client received (the tokens in flight after a stop
  // string are not), whichever way the call ends: the pump counts them.
  ReplyPump pump(loop_, loop_->Submit(*std::move(request)), std::move(text));
  auto call_ended = [context] { return WhyCallEnded(*context); };
  Clock::time_point first_in_handler{};  // when the handler got the first token
  Clock::time_point first_write{};       // when its Write returned
  ReplyPump::Hooks hooks{
      .token =
          [writer, &first_in_handler, &first_write](const SampledToken& token, const std::string& piece) {
            if (first_in_handler == Clock::time_point{}) first_in_handler = Clock::now();
            v1::GenerateResponse response;
            v1::TokenDelta* delta = response.mutable_delta();
            delta->add_token_ids(token.id);
            delta->add_logprobs(token.logprob);
            delta->set_text(piece);
            const bool written = writer->Write(response);
            if (written && first_write == Clock::time_point{}) first_write = Clock::now();
            return written;
          },
      .rest =
          [writer](const std::string& rest) {
            v1::GenerateResponse response;
            response.mutable_delta()->set_text(rest);
            writer->Write(response);
          },
      .idle = [context, call_ended] { return context->IsCancelled() ? call_ended() : absl::OkStatus(); },
      .gone = call_ended,
  };
  absl::StatusOr<std::shared_ptr<const GenerateResult>> result = pump.Run(hooks);
  if (!result.ok()) return ToGrpcStatus(result.status());
  v1::GenerateResponse response;
  FillDone(**result, call->request_id(), pump.streamed(), pump.stopped(), MillisSince(arrival),
           response.mutable_done());
  v1::Timings* timings = response.mutable_done()->mutable_timings();
  timings->set_arrival_monotonic_ns(MonotonicNanos(arrival));
  if (first_write != Clock::time_point{}) {
    timings->set_first_token_in_handler_monotonic_ns(MonotonicNanos(first_in_handler));
    timings->set_first_write_monotonic_ns(MonotonicNanos(first_write));
  }
  writer->Write(response);
  return grpc::Status::OK;
}

grpc::Status GenerationService::Tokenize(grpc::ServerContext* context, const v1::TokenizeRequest* call,
                                         v1::TokenizeResponse* reply) {
  if (grpc::Status refused = Authorize(context); !refused.ok()) return refused;
  if (call->text().size() > options_.max_text_bytes) {
    return grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrFormat("text: %d bytes exceed max_text_bytes=%d", call->text().size(), options_.max_text_bytes));
  }
  for (int32_t id : tokenizer_->Encode(call->text())) reply->add_ids(id);
  reply->set_vocab_size(loop_->engine().config().vocab_size);
  reply->set_max_context(loop_->engine().config().max_seq_len);
  return grpc::Status::OK;
}

}  // namespace lazykv
