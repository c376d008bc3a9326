// What the OpenAI-compatible HTTP API costs over the gRPC API, per streamed token: one
// lazykv-worker (CPU backend, a small synthetic model of Llama 3's vocabulary, the shared
// Llama 3 tokenizer and chat template), the same greedy request streamed through each API
// in alternation, one at a time. Reports per API the median time per request and per
// token and the difference per token; the engine's work is the same in both, so the
// difference is the API's own (JSON, server-sent events, HTTP) on top of gRPC's.
//
//   api_overhead_bench [--requests N] [--max-tokens N] [--model synthetic:NAME]
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "common/child_process.h"
#include "common/flag_parser.h"
#include "common/grpc_util.h"
#include "common/security/transport_security.h"
#include "nlohmann/json.hpp"
#include "proto/generate.grpc.pb.h"

namespace lazykv {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

struct Run {
  double seconds = 0;
  int tokens = 0;
};

constexpr char kQuestion[] = "Tell me a long story about a llama who crosses the Andes.";

Run GrpcRun(v1::Generation::Stub& stub, int max_tokens) {
  v1::GenerateRequest request;
  request.set_prompt_text(kQuestion);
  request.mutable_sampling()->set_max_tokens(max_tokens);
  request.mutable_sampling()->add_stop_token_ids(128009);
  grpc::ClientContext context;
  const auto start = Clock::now();
  auto reader = stub.Generate(&context, request);
  Run run;
  v1::GenerateResponse message;
  while (reader->Read(&message)) run.tokens += message.delta().token_ids_size();
  if (!reader->Finish().ok()) std::fprintf(stderr, "gRPC call failed\n");
  run.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return run;
}

// The completions endpoint with the same prompt text, streamed; a token per content event.
Run HttpRun(httplib::Client& client, int max_tokens) {
  const json body = {{"model", "bench"},           {"prompt", kQuestion}, {"max_tokens", max_tokens},
                     {"stop_token_ids", {128009}}, {"stream", true},      {"temperature", 0}};
  httplib::Request request;
  request.method = "POST";
  request.path = "/v1/completions";
  request.body = body.dump();
  request.set_header("Content-Type", "application/json");
  std::string stream;
  request.content_receiver = [&](const char* data, size_t size, uint64_t, uint64_t) {
    stream.append(data, size);
    return true;
  };
  const auto start = Clock::now();
  httplib::Response response;
  httplib::Error error = httplib::Error::Success;
  if (!client.send(request, response, error) || response.status != 200) std::fprintf(stderr, "HTTP call failed\n");
  Run run;
  run.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  // Text events: one per token whose text could be shown at once (a partial character
  // waits for the next), plus the finishing one; per-token figures use gRPC's count.
  for (size_t at = stream.find("data: {"); at != std::string::npos; at = stream.find("data: {", at + 1)) ++run.tokens;
  return run;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

int Main(int argc, char** argv) {
  int requests = 40, max_tokens = 64;
  std::string model = "synthetic:tiny-llama3-vocab";
  std::string tokenizer = LAZYKV_DEFAULT_TOKENIZERS_DIR "/llama3/tokenizer.json";
  std::string worker_binary = LAZYKV_WORKER;
  FlagParser parser("usage: api_overhead_bench [--requests N] [--max-tokens N] [--model M] [--tokenizer PATH]");
  parser.AddInt("--requests", &requests);
  parser.AddInt("--max-tokens", &max_tokens);
  parser.AddString("--model", &model);
  parser.AddString("--tokenizer", &tokenizer);
  if (absl::Status s = parser.Parse(argc, argv); !s.ok()) return ExitForFlagError(s, "api_overhead_bench");
  ServerProcess worker(worker_binary,
                       {"--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0", "--model", model, "--tokenizer",
                        tokenizer, "--no-cache-tier", "--served-model-name", "bench"},
                       "/tmp/api_overhead_bench_worker.log");
  if (!worker.started()) {
    std::fprintf(stderr, "the worker did not start: see /tmp/api_overhead_bench_worker.log\n");
    return 1;
  }
  auto stub = v1::Generation::NewStub(MakeClientChannel(worker.address(), ClientSecurityOptions{}));
  httplib::Client client("http://" + worker.http_address());
  client.set_read_timeout(120, 0);
  client.set_keep_alive(true);
  client.set_tcp_nodelay(true);
  // Warm-up: both paths, the engine, the connections.
  for (int i = 0; i < 3; ++i) {
    GrpcRun(*stub, max_tokens);
    HttpRun(client, max_tokens);
  }
  std::vector<double> grpc_per_request, http_per_request, grpc_per_token, http_per_token;
  int grpc_tokens = 0, http_events = 0;
  for (int i = 0; i < requests; ++i) {
    // Alternate which goes first, so that neither always follows the other.
    Run g, h;
    if (i % 2 == 0) {
      g = GrpcRun(*stub, max_tokens);
      h = HttpRun(client, max_tokens);
    } else {
      h = HttpRun(client, max_tokens);
      g = GrpcRun(*stub, max_tokens);
    }
    grpc_per_request.push_back(g.seconds);
    http_per_request.push_back(h.seconds);
    grpc_per_token.push_back(g.seconds / std::max(1, g.tokens));
    http_per_token.push_back(h.seconds / std::max(1, g.tokens));  // the same greedy reply: gRPC's count
    grpc_tokens += g.tokens;
    http_events += h.tokens;
  }
  std::printf("model %s, %d requests per API, up to %d tokens each, greedy, one at a time\n", model.c_str(), requests,
              max_tokens);
  std::printf("tokens per request: %.1f (gRPC); HTTP events per request: %.1f\n",
              static_cast<double>(grpc_tokens) / requests, static_cast<double>(http_events) / requests);
  std::printf("%-6s %16s %16s\n", "api", "ms per request", "us per token");
  std::printf("%-6s %16.3f %16.1f\n", "gRPC", Median(grpc_per_request) * 1e3, Median(grpc_per_token) * 1e6);
  std::printf("%-6s %16.3f %16.1f\n", "HTTP", Median(http_per_request) * 1e3, Median(http_per_token) * 1e6);
  std::printf("HTTP over gRPC: %+.1f us per token (%.3fx per request, medians)\n",
              (Median(http_per_token) - Median(grpc_per_token)) * 1e6,
              Median(http_per_request) / Median(grpc_per_request));
  worker.Stop(SIGTERM);
  return 0;
}

}  // namespace
}  // namespace lazykv

int main(int argc, char** argv) { return lazykv::Main(argc, argv); }
