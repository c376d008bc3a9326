// The OpenAI-compatible HTTP API of a worker (DESIGN.md section 4): POST /v1/completions
// and /v1/chat/completions (stream: true as server-sent events ending in "data: [DONE]"),
// GET /v1/models and GET /health, over the same GenerationLoop, tokenizer, limits and
// bearer tokens (client role) as the gRPC API. Requests and replies: openai_request.h,
// openai_response.h.
//
// Limits: bodies over max_body_bytes are 413; a request runs at most request_timeout
// (then 504, or an error event when streaming); a client that stops reading is cut off
// after write_timeout and its request cancelled in the engine; idle keep-alive
// connections close after idle_timeout. At most `threads` connections are served at once
// and `max_queued_connections` wait; past them a connection gets 429 at once
// (common/http_connection_pool.h), as a request the engine sheds does.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/http_listener.h"
#include "common/security/call_authorizer.h"
#include "worker/chat_template/chat_template.h"
#include "worker/openai/openai_request.h"
#include "worker/serve/generation_loop.h"
#include "worker/serve/generation_service.h"

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace lazykv {

struct OpenAiServerOptions {
  std::string listen;                           // HOST:PORT
  std::vector<std::string> served_model_names;  // what `model` may say; the first is listed
  int threads = 64;
  int max_queued_connections = 64;
  size_t max_body_bytes = 16 << 20;
  std::chrono::seconds request_timeout{600};
  std::chrono::seconds read_timeout{30};
  std::chrono::seconds write_timeout{30};
  std::chrono::seconds idle_timeout{5};
  OpenAiLimits limits;
};

// Thread-safe: httplib's threads run the handlers; they reach the engine only through the
// GenerationLoop. Everything passed to Start must outlive the server.
class OpenAiServer {
 public:
  // `chat.chat_template` null: chat completions are refused (400). `authorizer` null:
  // every call is allowed.
  static absl::StatusOr<std::unique_ptr<OpenAiServer>> Start(OpenAiServerOptions options,
                                                             const ServerSecurityOptions& security,
                                                             GenerationLoop* loop, const Tokenizer* tokenizer,
                                                             ChatSettings chat, GenerationServiceOptions service,
                                                             const CallAuthorizer* authorizer);
  ~OpenAiServer();  // Stop()

  int port() const { return listener_->port(); }
  // New requests get 503 and /health says so; requests under way go on.
  void BeginShutdown() { shutting_down_ = true; }
  // Waits until no generation request is in flight, or `deadline` (graceful shutdown:
  // after BeginShutdown, give the requests under way their grace period).
  void WaitForCalls(std::chrono::steady_clock::time_point deadline) const;
  // Stops accepting; returns when every handler has returned.
  void Stop();

 private:
  struct Call;
  OpenAiServer() = default;

  void Generate(const httplib::Request& request, httplib::Response& response, OpenAiEndpoint endpoint);
  // OK, or the refusal already written to `response` (also counted).
  bool Admit(const httplib::Request& request, httplib::Response& response);
  void Refuse(httplib::Response& response, const absl::Status& status);
  void Reply(Call& call, httplib::Response& response);
  void Stream(std::shared_ptr<Call> call, httplib::Response& response);

  OpenAiServerOptions options_;
  GenerationLoop* loop_ = nullptr;
  const Tokenizer* tokenizer_ = nullptr;
  ChatSettings chat_;
  GenerationServiceOptions service_;
  const CallAuthorizer* authorizer_ = nullptr;
  std::unique_ptr<HttpListener> listener_;
  std::atomic<bool> shutting_down_{false};
  std::atomic<uint64_t> next_id_{0};
  std::atomic<int> in_flight_{0};  // generation requests admitted and not yet answered
  uint64_t id_salt_ = 0;
  int64_t started_at_ = 0;  // unix seconds, for /v1/models
};

}  // namespace lazykv
