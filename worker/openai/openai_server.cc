#include "worker/openai/openai_server.h"

#include <httplib.h>

#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/http_connection_pool.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"
#include "worker/openai/openai_response.h"
#include "worker/serve/reply_pump.h"
#include "worker/tokenizer/text_stream.h"

namespace lazykv {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

int64_t UnixSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void WriteJson(httplib::Response& response, int status, const json& body) {
  response.status = status;
  response.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

// The error body and status, with the headers a client acts on.
void WriteError(httplib::Response& response, const absl::Status& status) {
  const HttpError error = ErrorFor(status);
  if (error.status == 401) response.set_header("WWW-Authenticate", "Bearer realm=\"lazykv\"");
  if (error.status == 429 || error.status == 503) response.set_header("Retry-After", "1");
  WriteJson(response, error.status, error.body);
}

}  // namespace

// One request in flight (its engine stream and text: ReplyPump) and what its responses
// repeat. Shared by the handler and, when streaming, httplib's content provider.
struct OpenAiServer::Call {
  Call(std::atomic<int>* in_flight, std::unique_ptr<ReplyPump> pump) : in_flight(in_flight), pump(std::move(pump)) {
    ++*in_flight;
  }
  ~Call() {
    pump.reset();  // cancels a request still running, counts what was streamed
    --*in_flight;
  }
  std::atomic<int>* in_flight;
  std::unique_ptr<ReplyPump> pump;
  ResponseIdentity who;
  bool include_usage = false;
  Clock::time_point deadline;
  std::chrono::seconds timeout{0};

  // Past the request timeout: the reason it is cancelled.
  absl::Status PastDeadline() const {
    if (Clock::now() <= deadline) return absl::OkStatus();
    return absl::DeadlineExceededError(
        absl::StrFormat("the request ran past the server's request timeout of %d s", timeout.count()));
  }
};

absl::StatusOr<std::unique_ptr<OpenAiServer>> OpenAiServer::Start(OpenAiServerOptions options,
                                                                  const ServerSecurityOptions& security,
                                                                  GenerationLoop* loop, const Tokenizer* tokenizer,
                                                                  ChatSettings chat, GenerationServiceOptions service,
                                                                  const CallAuthorizer* authorizer) {
  if (options.served_model_names.empty()) return absl::InvalidArgumentError("--served-model-name: none given");
  if (options.threads <= 0 || options.max_queued_connections < 0) {
    return absl::InvalidArgumentError("--http-threads must be positive and --http-max-queued non-negative");
  }
  auto listener = HttpListener::Create("--http-listen", options.listen, security);
  if (!listener.ok()) return listener.status();
  std::unique_ptr<OpenAiServer> self(new OpenAiServer());
  self->options_ = std::move(options);
  self->loop_ = loop;
  self->tokenizer_ = tokenizer;
  self->chat_ = std::move(chat);
  self->service_ = service;
  self->authorizer_ = authorizer;
  self->listener_ = *std::move(listener);
  self->id_salt_ = std::random_device{}() * 0x9e3779b97f4a7c15ULL ^ std::random_device{}();
  self->started_at_ = UnixSeconds();

  OpenAiServer* s = self.get();
  httplib::Server& server = s->listener_->server();
  const OpenAiServerOptions& o = s->options_;
  const size_t threads = o.threads, queued = o.max_queued_connections;
  server.new_task_queue = [threads, queued] { return new HttpConnectionPool(threads, queued); };
  server.set_read_timeout(o.read_timeout);
  server.set_write_timeout(o.write_timeout);
  server.set_idle_interval(std::chrono::seconds(0));
  server.set_keep_alive_timeout(o.idle_timeout.count());
  server.set_payload_max_length(o.max_body_bytes);
  // Each token's event is a small write: Nagle's algorithm would hold it for the client's
  // delayed ACK.
  server.set_tcp_nodelay(true);
  server.Post("/v1/completions", [s](const httplib::Request& request, httplib::Response& response) {
    s->Generate(request, response, OpenAiEndpoint::kCompletions);
  });
  server.Post("/v1/chat/completions", [s](const httplib::Request& request, httplib::Response& response) {
    s->Generate(request, response, OpenAiEndpoint::kChatCompletions);
  });
  server.Get("/v1/models", [s](const httplib::Request& request, httplib::Response& response) {
    if (!s->Admit(request, response)) return;
    json data = json::array();
    for (const std::string& name : s->options_.served_model_names) {
      data.push_back({{"id", name},
                      {"object", "model"},
                      {"created", s->started_at_},
                      {"owned_by", "lazykv"},
                      {"max_model_len", s->loop_->engine().config().max_seq_len}});
    }
    WriteJson(response, 200, json{{"object", "list"}, {"data", data}});
  });
  server.Get("/health", [s](const httplib::Request&, httplib::Response& response) {
    response.status = s->shutting_down_ ? 503 : 200;
    response.set_content(s->shutting_down_ ? "shutting down\n" : "ok\n", "text/plain");
  });
  // A body that cannot fit is refused from its headers, before any of it is read (httplib
  // reads a body past its limit to the end before refusing it: a client sending a terabyte
  // held a thread and a core without an answer). The reply asks the client to close; httplib
  // 0.11.4 still reads what follows as the next request. A chunked body has no length to
  // check up front: the API takes Content-Length bodies only, as OpenAI's clients send.
  server.set_pre_routing_handler(
      [max_body = o.max_body_bytes](const httplib::Request& request, httplib::Response& response) {
        if (request.method != "POST") return httplib::Server::HandlerResponse::Unhandled;
        const std::string length = request.get_header_value("Content-Length");
        uint64_t bytes = 0;
        if (!length.empty() && absl::SimpleAtoi(length, &bytes) && bytes <= max_body) {
          return httplib::Server::HandlerResponse::Unhandled;
        }
        response.set_header("Connection", "close");
        if (!length.empty()) {
          response.status = 413;  // the error handler below writes the body
        } else {
          WriteJson(response, 411,
                    ErrorFor(absl::InvalidArgumentError("body: send it with a Content-Length (chunked request bodies "
                                                        "are not accepted)"))
                        .body);
        }
        return httplib::Server::HandlerResponse::Handled;
      });
  // A body over the limit, an unknown route: OpenAI-style errors, not httplib's empty ones.
  server.set_error_handler([](const httplib::Request&, httplib::Response& response) {
    if (!response.body.empty()) return;
    const absl::Status status =
        response.status == 413   ? absl::InvalidArgumentError("body: larger than the server's --http-max-body-bytes")
        : response.status == 404 ? absl::NotFoundError("no such route")
                                 : absl::InvalidArgumentError(absl::StrFormat("HTTP %d", response.status));
    const int code = response.status;
    WriteJson(response, code, ErrorFor(status).body);
  });
  if (absl::Status started = s->listener_->Start(); !started.ok()) return started;
  return self;
}

OpenAiServer::~OpenAiServer() { Stop(); }

void OpenAiServer::WaitForCalls(Clock::time_point deadline) const {
  while (in_flight_ > 0 && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

void OpenAiServer::Stop() {
  shutting_down_ = true;
  if (listener_ != nullptr) listener_->Stop();
}

void OpenAiServer::Refuse(httplib::Response& response, const absl::Status& status) {
  loop_->metrics().CountRequest(std::string(absl::StatusCodeToString(status.code())));
  WriteError(response, status);
}

bool OpenAiServer::Admit(const httplib::Request& request, httplib::Response& response) {
  if (HttpConnectionPool::Refusing()) {
    response.set_header("Connection", "close");
    Refuse(response, absl::ResourceExhaustedError(absl::StrFormat(
                         "server busy: all %d HTTP threads are serving and %d connections wait (--http-threads, "
                         "--http-max-queued); retry later",
                         options_.threads, options_.max_queued_connections)));
    return false;
  }
  if (shutting_down_) {
    Refuse(response, absl::UnavailableError("the server is shutting down; retry on another worker"));
    return false;
  }
  if (authorizer_ != nullptr && authorizer_->enabled()) {
    absl::StatusOr<Principal> caller =
        authorizer_->AuthorizeHttpHeader(request.get_header_value("Authorization"), Role::kClient);
    if (!caller.ok()) {
      Refuse(response, caller.status());
      return false;
    }
  }
  return true;
}

void OpenAiServer::Generate(const httplib::Request& request, httplib::Response& response, OpenAiEndpoint endpoint) {
  const Clock::time_point arrival = Clock::now();
  if (!Admit(request, response)) return;
  absl::StatusOr<OpenAiRequest> parsed = endpoint == OpenAiEndpoint::kChatCompletions
                                             ? ParseChatRequest(request.body, chat_, options_.limits)
                                             : ParseCompletionRequest(request.body, options_.limits);
  if (!parsed.ok()) return Refuse(response, parsed.status());
  const auto& names = options_.served_model_names;
  if (std::find(names.begin(), names.end(), parsed->model) == names.end()) {
    return Refuse(response, absl::NotFoundError(absl::StrCat("model: '", parsed->model,
                                                             "' is not served here; GET /v1/models lists it")));
  }
  const Clock::time_point deadline = arrival + options_.request_timeout;
  absl::StatusOr<GenerateRequest> engine_request =
      ToEngineRequest(parsed->call, *tokenizer_, service_, [deadline]() -> absl::Status {
        if (Clock::now() > deadline) return absl::DeadlineExceededError("the request timeout passed while tokenizing");
        return absl::OkStatus();
      });
  if (!engine_request.ok()) return Refuse(response, engine_request.status());
  engine_request->arrival = arrival;

  TextStream text(
      *tokenizer_, ReplyContext(loop_->engine().anchor(), *engine_request),
      std::vector<std::string>(parsed->call.sampling().stop().begin(), parsed->call.sampling().stop().end()));
  auto call = std::make_shared<Call>(
      &in_flight_, std::make_unique<ReplyPump>(loop_, loop_->Submit(*std::move(engine_request)), std::move(text)));
  call->who = ResponseIdentity{
      endpoint,
      absl::StrFormat("%s-%016x%08x", endpoint == OpenAiEndpoint::kChatCompletions ? "chatcmpl" : "cmpl", id_salt_,
                      next_id_.fetch_add(1)),
      UnixSeconds(), parsed->model};
  call->include_usage = parsed->include_usage;
  call->deadline = deadline;
  call->timeout = options_.request_timeout;
  // The status line goes out before the first byte of a stream: wait for the engine's
  // first word, so that a request it sheds or refuses gets its own status (429, 400).
  const EngineEvent* first = call->pump->First([&call] { return call->PastDeadline(); });
  if (first->kind == EngineEvent::Kind::kFailed) return WriteError(response, first->status);  // the loop counted it
  if (parsed->stream) return Stream(std::move(call), response);
  Reply(*call, response);
}

void OpenAiServer::Reply(Call& call, httplib::Response& response) {
  std::string text;
  // httplib cannot tell a client gone before writing: the request timeout bounds the wait.
  const absl::StatusOr<std::shared_ptr<const GenerateResult>> result =
      call.pump->Run({.token =
                          [&](const SampledToken&, const std::string& piece) {
                            text += piece;
                            return true;
                          },
                      .rest = [&](const std::string& rest) { text += rest; },
                      .idle = [&call] { return call.PastDeadline(); },
                      .gone = [] { return absl::CancelledError("the client went away"); }});
  if (!result.ok()) return WriteError(response, result.status());
  WriteJson(response, 200,
            CompletionJson(call.who, text, call.pump->FinishReason(**result), (*result)->usage, call.pump->streamed()));
}

void OpenAiServer::Stream(std::shared_ptr<Call> call, httplib::Response& response) {
  response.set_header("Cache-Control", "no-cache");
  response.set_header("X-Accel-Buffering", "no");  // proxies must not hold the events back
  response.set_chunked_content_provider(
      "text/event-stream",
      [call](size_t, httplib::DataSink& sink) {
        auto send = [&](const std::string& event) { return sink.write(event.data(), event.size()); };
        bool first = true;
        auto emit = [&](const std::string& piece) {
          const bool ok = send(ServerSentEvent(ChunkJson(call->who, piece, first, "")));
          first = false;
          return ok;
        };
        auto gone = [] { return absl::CancelledError("the client went away"); };
        // The role comes first in a chat stream, before any text.
        if (call->who.endpoint == OpenAiEndpoint::kChatCompletions && !emit("")) call->pump->Cancel(gone());
        auto last_sign_of_life = Clock::now();
        const absl::StatusOr<std::shared_ptr<const GenerateResult>> result =
            call->pump->Run({.token =
                                 [&](const SampledToken&, const std::string& piece) {
                                   if (piece.empty()) return true;  // a character still incomplete
                                   last_sign_of_life = Clock::now();
                                   return emit(piece);
                                 },
                             .rest = [&](const std::string& rest) { emit(rest); },
                             .idle = [&]() -> absl::Status {
                               RETURN_IF_ERROR(call->PastDeadline());
                               // A comment line while nothing else moves: finds a client that has gone.
                               if (Clock::now() - last_sign_of_life < std::chrono::seconds(1)) return absl::OkStatus();
                               last_sign_of_life = Clock::now();
                               return send(": waiting\n\n") ? absl::OkStatus() : gone();
                             },
                             .gone = gone});
        if (result.ok()) {
          send(ServerSentEvent(ChunkJson(call->who, "", first, call->pump->FinishReason(**result))));
          if (call->include_usage) {
            send(ServerSentEvent(UsageChunkJson(call->who, (*result)->usage, call->pump->streamed())));
          }
        } else {
          send(ServerSentEvent(ErrorFor(result.status()).body));
        }
        send("data: [DONE]\n\n");
        sink.done();
        return true;
      },
      [call](bool success) {
        if (!success) call->pump->Cancel(absl::CancelledError("the client went away"));
      });
}

}  // namespace lazykv
