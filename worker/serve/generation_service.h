// The Generation gRPC service (proto/generate.proto): turns a call into an engine
// request, streams its tokens as text deltas, applies stop strings, and ends with the
// usage and timings. A client that goes away or passes its deadline has its request
// cancelled in the engine, which frees its blocks at once.
#pragma once

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "proto/generate.grpc.pb.h"
#include "worker/serve/generation_loop.h"
#include "worker/tokenizer/tokenizer.h"

namespace lazykv {

struct GenerationServiceOptions {
  int default_max_tokens = 64;
  int max_documents = 1024;
  int max_stop_strings = 16;
  size_t max_stop_bytes = 256;
  // Each document's text and the prompt text, checked before anything is tokenized.
  size_t max_text_bytes = 1 << 20;
};

// The engine request a call asks for; INVALID_ARGUMENT names the offending field.
absl::StatusOr<GenerateRequest> ToEngineRequest(const v1::GenerateRequest& call, const Tokenizer& tokenizer,
                                                const GenerationServiceOptions& options);

// Thread-safe: gRPC handler threads call it at once; it reaches the engine only through
// the GenerationLoop's queues, and the tokenizer is read-only.
class GenerationService final : public v1::Generation::Service {
 public:
  GenerationService(GenerationLoop* loop, const Tokenizer* tokenizer, GenerationServiceOptions options)
      : loop_(loop), tokenizer_(tokenizer), options_(options) {}

  grpc::Status Generate(grpc::ServerContext* context, const v1::GenerateRequest* call,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) override;
  grpc::Status Tokenize(grpc::ServerContext* context, const v1::TokenizeRequest* call,
                        v1::TokenizeResponse* reply) override;

 private:
  GenerationLoop* loop_;
  const Tokenizer* tokenizer_;
  GenerationServiceOptions options_;
};

}  // namespace lazykv
