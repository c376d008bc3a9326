// The Generation gRPC service (proto/generate.proto): turns a call into an engine
// request, streams its tokens as text deltas, applies stop strings, and ends with the
// usage and timings. A client that goes away or passes its deadline has its request
// cancelled in the engine, which frees its blocks at once.
#pragma once

#include <grpcpp/grpcpp.h>

#include <functional>

#include "absl/status/statusor.h"
#include "common/security/call_authorizer.h"
#include "proto/generate.grpc.pb.h"
#include "worker/serve/generation_loop.h"
#include "worker/tokenizer/document_token_cache.h"
#include "worker/tokenizer/tokenizer.h"

namespace lazykv {

struct GenerationServiceOptions {
  int default_max_tokens = 64;
  int max_documents = 1024;
  int max_stop_strings = 16;
  size_t max_stop_bytes = 256;
  // Each document's text and the prompt text, checked before anything is tokenized.
  size_t max_text_bytes = 1 << 20;
  // Where documents' texts are tokenized, when set (not owned; it outlives the service): a
  // popular document is then tokenized once, not on every call (prompts are not cached).
  DocumentTokenCache* document_tokens = nullptr;
};

// The engine request a call asks for; INVALID_ARGUMENT names the offending field.
// `still_wanted` (may be empty) is asked before each text is tokenized; its error (the
// call was cancelled or passed its deadline) stops the work and is returned, so an
// abandoned call costs at most one text's tokenizing (--max-text-bytes bounds it).
absl::StatusOr<GenerateRequest> ToEngineRequest(const v1::GenerateRequest& call, const Tokenizer& tokenizer,
                                                const GenerationServiceOptions& options,
                                                const std::function<absl::Status()>& still_wanted = {});

// The tokens a reply's first words depend on (a leading space): the anchor and the end
// of the prompt, or of the last document when there is no prompt. For TextStream.
std::vector<int32_t> ReplyContext(const std::vector<int32_t>& anchor, const GenerateRequest& request);

// Generate and Tokenize need the client role (common/security/call_authorizer.h).
//
// Thread-safe: gRPC handler threads call it at once; it reaches the engine only through
// the GenerationLoop's queues, and the tokenizer and the authorizer are thread-safe.
class GenerationService final : public v1::Generation::Service {
 public:
  // `authorizer` null: every call is allowed. It must outlive the service.
  GenerationService(GenerationLoop* loop, const Tokenizer* tokenizer, GenerationServiceOptions options,
                    const CallAuthorizer* authorizer = nullptr);

  grpc::Status Generate(grpc::ServerContext* context, const v1::GenerateRequest* call,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) override;
  grpc::Status Tokenize(grpc::ServerContext* context, const v1::TokenizeRequest* call,
                        v1::TokenizeResponse* reply) override;

 private:
  // The refusal of a caller without the client role, counted as a request outcome; OK to go on.
  grpc::Status Authorize(const grpc::ServerContext* context);

  GenerationLoop* loop_;
  const Tokenizer* tokenizer_;
  GenerationServiceOptions options_;
  std::unique_ptr<CallAuthorizer> allow_all_;  // when constructed without an authorizer
  const CallAuthorizer* authorizer_;
};

}  // namespace lazykv
